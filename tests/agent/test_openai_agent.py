"""The openai_agent loop: an agent written with the `openai` client, its calculator in its own code, becomes one
trajectory — model tokens with mask 1 and their log-probs, what the agent added with mask 0 — that re-scores to
the sampled log-probs; a rewritten history fails the episode with a clear error."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hyflow.agent.chat import MessageDelta
from hyflow.agent.loop import AgentLoopContext, get_agent_loop_class
from hyflow.agent.openai_agent import HistoryRewritten, openai_agent
from hyflow.agent.parsers import ToolParser
from hyflow.agent.server import LocalEngineServer
from hyflow.config.actor_rollout_ref import MultiTurnConfig
from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.models.tiny import build_tiny_model

from .conftest import tool_call

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "evaluates a product",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


@openai_agent("test_calculator_agent")
async def calculator_agent(client, sample):
    """Asks, runs the calculator itself when the model calls it (or says so), asks again; rewards a right answer."""
    messages = [{"role": "user", "content": sample["question"]}]
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], max_tokens=64)
    message = reply.choices[0].message
    messages.append(message)
    calls = message.tool_calls or []
    for call in calls:
        arguments = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] * arguments["b"])})
    if not calls:
        messages.append({"role": "user", "content": "Use the calculator."})
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], max_tokens=64)
    return 1.0 if "42" in (reply.choices[0].message.content or "") else 0.0


@openai_agent("test_rewriting_agent")
async def rewriting_agent(client, sample):
    messages = [{"role": "user", "content": "first question"}]
    reply = await client.chat.completions.create(model="policy", messages=messages)
    rewritten = [{"role": "user", "content": "a different first question"}, reply.choices[0].message]
    await client.chat.completions.create(model="policy", messages=[*rewritten, {"role": "user", "content": "next"}])


ECHO = {
    "type": "function",
    "function": {"name": "echo", "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}},
}


@openai_agent("test_echo_agent")
async def echo_agent(client, sample):
    """One call: rewards 1 when the word of the echo call comes back as the string its schema declares."""
    messages = [{"role": "user", "content": "say 3"}]
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=[ECHO], max_tokens=64)
    (call,) = reply.choices[0].message.tool_calls
    return 1.0 if json.loads(call.function.arguments) == {"word": "3"} else 0.0


@openai_agent("test_video_agent")
async def video_agent(client, sample):
    clip = {"type": "video_url", "video_url": {"url": "data:image/gif;base64,R0lGODlhAQABAAAAACw="}}
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": [clip]}])


def run_loop(context: AgentLoopContext, name: str, params: SamplingParams, **sample):
    loop = get_agent_loop_class(name)(context)
    return asyncio.run(loop.run(params, request_id="episode-0", **sample))


def test_a_tool_using_agent_becomes_one_masked_trajectory(make_server, make_context, tokenizer):
    script = ["Let me compute." + tool_call("calculator", a=6, b=7), "It is 42."]
    server = make_server(script, add_eos=True)
    output = run_loop(make_context(server), "test_calculator_agent", SamplingParams(), question="6 times 7?")
    emitted = server.emitted["episode-0"]
    model_tokens = [t for t, m in zip(output.response_ids, output.response_mask) if m == 1]
    assert model_tokens == [token for token, _ in emitted]
    assert [lp for lp, m in zip(output.response_log_probs, output.response_mask) if m] == [lp for _, lp in emitted]
    added = tokenizer.decode([t for t, m in zip(output.response_ids, output.response_mask) if m == 0])
    assert "<tool_response>\n42\n</tool_response>" in added
    assert output.extra_fields["agent_reward"] == 1.0 and output.num_turns == 4  # prompt, call, tool result, answer
    # the second request's context is the first one's plus the reply and the tool's delta, token for token
    first, second = server.calls
    assert (
        second["prompt_ids"]
        == first["prompt_ids"] + output.response_ids[: len(second["prompt_ids"]) - len(first["prompt_ids"])]
    )


def test_a_rewritten_history_fails_the_episode_naming_the_message(make_server, make_context):
    server = make_server(["an answer"], add_eos=True)
    with pytest.raises(HistoryRewritten, match=r"messages\[0\] is not the conversation so far"):
        run_loop(make_context(server), "test_rewriting_agent", SamplingParams())


@pytest.mark.timeout(120)
def test_the_assembled_trajectory_re_scores_to_the_sampled_log_probs(tmp_path):
    path = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2)
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = LLMEngine(path, EngineConfig(max_model_len=512, num_kv_blocks=128), tokenizer)
    config = MultiTurnConfig(enable=True)
    context = AgentLoopContext(
        server=LocalEngineServer(AsyncLLMEngine(engine)),
        tokenizer=tokenizer,
        response_length=96,
        multi_turn=config,
        tool_parser=ToolParser.get(config.format, tokenizer),
        message_delta=MessageDelta(tokenizer),
    )
    output = run_loop(context, "test_calculator_agent", SamplingParams(seed=5), question="6 times 7?")
    assert 0 in output.response_mask and output.response_mask.count(1) > 0
    ids = torch.tensor([output.prompt_ids + output.response_ids])
    with torch.no_grad():
        log_probs = AutoModelForCausalLM.from_pretrained(path)(ids).logits[0, :-1].float().log_softmax(-1)
    start = len(output.prompt_ids)
    rescored = log_probs[start - 1 :].gather(1, ids[0, start:, None]).squeeze(1)
    mask = torch.tensor(output.response_mask, dtype=torch.bool)
    torch.testing.assert_close(rescored[mask], torch.tensor(output.response_log_probs)[mask], atol=2e-4, rtol=1e-4)


def test_an_agent_function_becomes_a_loop_class_the_yaml_can_name(tmp_path):
    from hyflow.agent import openai_agent_loop
    from hyflow.agent.manager import register_loops_from_config

    module = tmp_path / "my_agents.py"
    module.write_text(
        "from hyflow.agent import openai_agent_loop\n\n"
        "async def run(client, sample):\n    return None\n\n"
        "MyAgent = openai_agent_loop(run)\n"
    )
    config = tmp_path / "loops.yaml"
    config.write_text("agent_loops:\n  - {name: my_yaml_agent, _target_: my_agents.MyAgent}\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        register_loops_from_config(str(config))
    finally:
        sys.path.remove(str(tmp_path))
    loop_class = get_agent_loop_class("my_yaml_agent")
    assert loop_class.__name__ == "RunAgentLoop" and loop_class.agent.__name__ == "run"
    assert openai_agent_loop(calculator_agent).agent is calculator_agent


@openai_agent("test_text_reward_agent")
async def text_reward_agent(client, sample):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    return "good"


def test_a_reward_that_is_not_a_number_fails_the_episode_naming_the_function(make_server, make_context):
    server = make_server(["an answer"], add_eos=True)
    with pytest.raises(TypeError, match=r"text_reward_agent returned 'good' \(str\); it returns a number"):
        run_loop(make_context(server), "test_text_reward_agent", SamplingParams())


@pytest.mark.parametrize(
    ("script", "reward", "tool_result"),
    [
        ([tool_call("calculator", expression="6 * 7"), "<answer>42</answer>"], 1.0, "42"),  # call ran, right answer
        ([tool_call("calculator", expression="6 *"), "<answer>42</answer>"], 0.5, "Error: "),  # the call failed
        (["<answer>41</answer>"], 0.05, None),  # no call, the format alone
    ],
)
def test_the_demo_agent_runs_the_calculator_itself_and_rewards_the_call_and_the_answer(
    make_server, make_context, tokenizer, script, reward, tool_result
):
    from hyflow.demos.openai_agent import CalculatorAgent

    sample = {"raw_prompt": [{"role": "user", "content": "Compute 6 * 7."}], "reward_model": {"ground_truth": "42"}}
    loop = CalculatorAgent(make_context(make_server(script, add_eos=True)))
    output = asyncio.run(loop.run(SamplingParams(), request_id="episode-0", **sample))
    assert output.extra_fields["agent_reward"] == pytest.approx(reward)
    added = tokenizer.decode([t for t, m in zip(output.response_ids, output.response_mask) if m == 0])
    assert (tool_result is None) == ("<tool_response>" not in added)
    if tool_result is not None:
        assert f"<tool_response>\n{tool_result}" in added


def test_the_agents_tools_reach_the_parser_so_a_qwen3_xml_value_keeps_its_declared_type(make_server, make_context):
    server = make_server(["<tool_call>\n<function=echo>\n<parameter=word>\n3\n</parameter>\n</function>\n</tool_call>"])
    context = make_context(server, format="qwen3_coder")
    output = run_loop(context, "test_echo_agent", SamplingParams())
    assert output.extra_fields["agent_reward"] == 1.0  # without the schema the parser reads the word as the number 3


def test_a_video_part_sent_to_the_rollout_endpoint_is_a_400_saying_it_trains_on_text(make_server, make_context):
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\] has a video_url part.*text conversations only"):
        run_loop(make_context(make_server(["an answer"])), "test_video_agent", SamplingParams())
