"""Thinking-model templates and token drift: every multi-turn loop trains on exactly the tokens the engine sampled.

The tiny model's thinking template (hyflow.models.tiny.THINKING_CHAT_TEMPLATE, Qwen3-style) drops the `<think>`
block of every assistant turn before the last user message when it renders a conversation, so re-rendering a
multi-turn trajectory would not give back the sampled tokens. A tiny model is first fitted (a few seconds of SFT)
to answer each turn of these episodes with a `<think>` block; then the tool agent (tools and an interaction), the
interaction loop and the openai_agent loop (whose client sends replies back without their `<think>` block, as
clients of thinking models do) run on hyflow's engine, greedy, and each test checks that
(a) the tokens under response_mask 1 are the engine's sampled tokens, turn by turn, and each turn was generated
    from exactly the trajectory before it,
(b) re-scoring prompt + response with the HF model (fp32) gives the engine's log-probs at every mask-1 position,
(c) the template's rendering of the same conversation is not the trajectory (earlier turns' reasoning is gone).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from hyflow import fields as F
from hyflow.agent.chat import MessageDelta, encode_text, render
from hyflow.agent.interactions.answer_check import AnswerCheckInteraction
from hyflow.agent.loop import AgentLoopContext, AgentLoopOutput, get_agent_loop_class
from hyflow.agent.manager import AgentLoopManager
from hyflow.agent.openai_agent import openai_agent
from hyflow.agent.parsers import ToolParser
from hyflow.agent.server import LocalEngineServer
from hyflow.agent.tool_agent import ToolAgentLoop
from hyflow.config.actor_rollout_ref import MultiTurnConfig, RolloutConfig
from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.models.tiny import build_tiny_model, build_tiny_tokenizer
from hyflow.protocol import DataProto

from .conftest import ScriptedServer, tool_call
from .test_tool_agent import RecordingTool, schema

pytestmark = pytest.mark.timeout(180)

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
FEEDBACK = "Your answer is incorrect. Please check your work and try again."
GSM8K_KWARGS = {"name": "answer_check", "ground_truth": "5", "data_source": "openai/gsm8k"}
# Each model turn thinks first; the tool agent and the openai agent play the same episode: a call, a wrong answer,
# feedback, the right answer.
TOOL_TURNS = [
    "<think>I call echo.</think>" + tool_call("echo", x="a"),
    "<think>It said a, so 4.</think>#### 4",
    "<think>No: 2 + 3 is 5.</think>#### 5",
]
ANSWER_TURNS = ["<think>About 4.</think>#### 4", "<think>Exactly 5.</think>#### 5"]


@openai_agent("test_thinking_agent")
async def thinking_agent(client, sample):
    """Runs echo when the model calls it and gives feedback on a wrong answer; sends each reply back without its
    reasoning (the content after `</think>`), as a client of a thinking model does. Rewards the answer 5."""
    messages: list[Any] = list(QUESTION)
    for _ in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[schema("echo")])
        message = reply.choices[0].message.model_dump(exclude_none=True)
        message["content"] = (message.get("content") or "").split("</think>")[-1]
        messages.append(message)
        if message.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "echo:a"})
        elif message["content"].endswith("#### 5"):
            return 1.0
        else:
            messages.append({"role": "user", "content": FEEDBACK})
    return 0.0


class RecordingServer:
    """Wraps a server and keeps each turn's prompt and sampled output."""

    def __init__(self, server: Any) -> None:
        self.server, self.turns = server, []

    async def generate(self, request_id, prompt_ids, sampling_params, **vision):
        output = await self.server.generate(request_id, prompt_ids, sampling_params, **vision)
        self.turns.append((list(prompt_ids), output))
        return output


def make_context(tokenizer, server, tools=(), **multi_turn: Any) -> AgentLoopContext:
    config = MultiTurnConfig(enable=True, **multi_turn)
    return AgentLoopContext(
        server=server,
        tokenizer=tokenizer,
        response_length=200,
        multi_turn=config,
        tool_parser=ToolParser.get(config.format, tokenizer),
        message_delta=MessageDelta(tokenizer),
        tools={tool.name: tool for tool in tools},
        interactions={"answer_check": AnswerCheckInteraction("answer_check", {})},
    )


def run_episode(kind: str, tokenizer, server, params: SamplingParams) -> AgentLoopOutput:
    """One episode of `kind` (tool, interaction, openai) on `server`."""
    if kind == "openai":
        context = make_context(tokenizer, server)
        loop = get_agent_loop_class("test_thinking_agent")(context)
        return asyncio.run(loop.run(params, request_id="openai-0"))
    tools = [RecordingTool("echo")] if kind == "tool" else []
    context = make_context(tokenizer, server, tools, max_user_turns=1)
    row = {"raw_prompt": QUESTION, "interaction_kwargs": GSM8K_KWARGS}
    return asyncio.run(ToolAgentLoop(context).run(params, request_id=f"{kind}-0", **row))


SCRIPTS = {"tool": TOOL_TURNS, "interaction": ANSWER_TURNS, "openai": TOOL_TURNS}


def fit_to_scripts(path: str, sequences: list[tuple[list[int], list[int]]]) -> None:
    """SFT the model at `path` until greedy decoding gives every scripted turn (loss on the mask-1 tokens only)."""
    model = AutoModelForCausalLM.from_pretrained(path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    for _ in range(400):
        correct = True
        optimizer.zero_grad()
        for ids, mask in sequences:
            logits = model(torch.tensor([ids])).logits[0, :-1]
            targets = torch.tensor(ids[1:])
            trained = torch.tensor(mask[1:], dtype=torch.bool)
            torch.nn.functional.cross_entropy(logits[trained], targets[trained]).backward()
            correct = correct and bool((logits[trained].argmax(-1) == targets[trained]).all())
        if correct:
            break
        optimizer.step()
    assert correct, "the tiny model did not learn the scripted turns"
    model.save_pretrained(path)


@pytest.fixture(scope="module")
def thinking_tokenizer():
    return build_tiny_tokenizer(thinking=True)


@pytest.fixture(scope="module")
def thinking_model_path(tmp_path_factory, thinking_tokenizer) -> str:
    """A tiny model with the thinking template, fitted to answer each scripted turn with its <think> block."""
    folder = tmp_path_factory.mktemp("thinking") / "model"
    path = build_tiny_model(folder, hidden_size=32, intermediate_size=64, tokenizer=thinking_tokenizer)
    sequences = []
    for kind, script in SCRIPTS.items():
        out = run_episode(kind, thinking_tokenizer, ScriptedServer(thinking_tokenizer, script), SamplingParams())
        sequence = (out.prompt_ids + out.response_ids, [0] * len(out.prompt_ids) + out.response_mask)
        if sequence not in sequences:  # the tool and openai episodes are the same tokens
            sequences.append(sequence)
    fit_to_scripts(path, sequences)
    return path


def mask_one_runs(output: AgentLoopOutput) -> list[list[int]]:
    """The response's runs of mask-1 tokens, in order (one per model turn)."""
    runs, previous = [], 0
    for token, mask in zip(output.response_ids, output.response_mask):
        if mask and not previous:
            runs.append([])
        if mask:
            runs[-1].append(token)
        previous = mask
    return runs


def rescored_log_probs(path: str, output: AgentLoopOutput) -> torch.Tensor:
    """The HF model's (fp32) log-prob of each response token given everything before it."""
    ids = torch.tensor([output.prompt_ids + output.response_ids])
    with torch.no_grad():
        log_probs = AutoModelForCausalLM.from_pretrained(path).float()(ids).logits[0, :-1].log_softmax(-1)
    start = len(output.prompt_ids)
    return log_probs[start - 1 :].gather(1, ids[0, start:, None]).squeeze(1)


def conversation(kind: str, turns: list[str]) -> tuple[list[dict[str, Any]], list[dict] | None]:
    """The episode as chat messages (each assistant turn as its sampled text) and the tools it was shown."""
    replies = iter({"role": "assistant", "content": text} for text in turns)
    if kind == "interaction":
        return [*QUESTION, next(replies), {"role": "user", "content": FEEDBACK}, next(replies)], None
    tool = {"role": "tool", "content": "echo:a"}
    user = {"role": "user", "content": FEEDBACK}
    return [*QUESTION, next(replies), tool, next(replies), user, next(replies)], [schema("echo")]


@pytest.mark.parametrize("kind", ["tool", "interaction", "openai"])
def test_a_thinking_models_multi_turn_trajectory_is_the_sampled_tokens_and_re_scores_to_the_engines_log_probs(
    kind, thinking_tokenizer, thinking_model_path
):
    tokenizer = thinking_tokenizer
    engine = LLMEngine(thinking_model_path, EngineConfig(max_model_len=512, num_kv_blocks=64), tokenizer)
    server = RecordingServer(LocalEngineServer(AsyncLLMEngine(engine)))
    output = run_episode(kind, tokenizer, server, SamplingParams(temperature=0.0))

    sampled = [out.token_ids for _, out in server.turns]
    # (a) mask 1 holds the sampled tokens, turn by turn, and each turn continued exactly the trajectory before it
    assert mask_one_runs(output) == sampled
    trajectory = output.prompt_ids + output.response_ids
    for prompt_ids, _ in server.turns:
        assert trajectory[: len(prompt_ids)] == prompt_ids
    # (b) the trajectory re-scores to the engine's log-probs at every mask-1 position
    mask = torch.tensor(output.response_mask, dtype=torch.bool)
    engine_log_probs = torch.tensor(output.response_log_probs)
    assert engine_log_probs[mask].tolist() == [log_prob for _, out in server.turns for log_prob in out.log_probs]
    rescored = rescored_log_probs(thinking_model_path, output)[mask]
    torch.testing.assert_close(rescored, engine_log_probs[mask], atol=1e-5, rtol=1e-5)
    turns = [tokenizer.decode(ids[:-1]) for ids in sampled]
    assert turns == SCRIPTS[kind], "the fitted model answers each turn with its <think> block"
    # (c) the template's rendering of the conversation drops the earlier turns' reasoning: not the trajectory
    messages, tools = conversation(kind, turns)
    rerendered = encode_text(tokenizer, render(tokenizer, messages, tools))
    first_thought = turns[0].split("</think>")[0] + "</think>"
    assert first_thought in tokenizer.decode(trajectory)
    assert first_thought not in tokenizer.decode(rerendered) and rerendered[: len(trajectory)] != trajectory


def test_the_rollout_endpoint_extends_the_sampled_tokens_when_a_reply_comes_back_without_its_reasoning(
    thinking_tokenizer,
):
    server = ScriptedServer(thinking_tokenizer, TOOL_TURNS)
    output = run_episode("openai", thinking_tokenizer, server, SamplingParams())
    emitted = [token for token, _ in server.emitted["openai-0"]]
    runs = mask_one_runs(output)
    assert [token for run in runs for token in run] == emitted and len(runs) == 3
    assert thinking_tokenizer.decode(output.response_ids).count("<think>I call echo.</think>") == 1
    assert output.extra_fields["agent_reward"] == 1.0


def test_the_manager_renders_every_prompt_and_delta_with_the_datasets_chat_template_kwargs(
    tmp_path, thinking_tokenizer
):
    interactions = tmp_path / "interactions.yaml"
    interactions.write_text("interaction:\n  - name: answer_check\n    class_name: answer_check\n")
    config = RolloutConfig(prompt_length=64, response_length=64)
    config.multi_turn.interaction_config_path = str(interactions)
    config.multi_turn.max_user_turns = 1
    server = ScriptedServer(thinking_tokenizer, ["#### 4", "#### 5"])
    manager = AgentLoopManager(config, thinking_tokenizer, [server], chat_template_kwargs={"enable_thinking": False})
    rows = {
        F.RAW_PROMPT: [QUESTION, QUESTION],
        F.AGENT_NAME: ["single_turn_agent", "tool_agent"],
        F.INTERACTION_KWARGS: [{}, GSM8K_KWARGS],
    }
    manager.generate_sequences(DataProto.from_dict(non_tensors=rows))
    dataset_prompt = encode_text(
        thinking_tokenizer, render(thinking_tokenizer, QUESTION, None, True, {"enable_thinking": False})
    )
    empty_thought = encode_text(thinking_tokenizer, "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    prompts = [call["prompt_ids"] for call in server.calls]
    assert len(prompts) == 3 and prompts[0] == prompts[1] == dataset_prompt
    assert all(prompt[-len(empty_thought) :] == empty_thought for prompt in prompts)  # also after the feedback
