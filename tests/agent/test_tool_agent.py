"""ToolAgentLoop: every path of the state machine, with a scripted server and small in-test tools."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from hyflow.agent.interactions.answer_check import AnswerCheckInteraction
from hyflow.agent.interactions.base import BaseInteraction
from hyflow.agent.loop import AgentData
from hyflow.agent.parsers import FunctionCall, ParsedToolCalls, ToolParser
from hyflow.agent.tool_agent import TOOL_ERROR_PREFIX, ToolAgentLoop
from hyflow.agent.tools.base import BaseTool, ToolResponse
from hyflow.agent.tools.calculator import CalculatorTool
from hyflow.agent.tools.registry import load_all_tools
from hyflow.engine.config import SamplingParams

pytestmark = pytest.mark.timeout(60)

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def schema(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        },
    }


class RecordingTool(BaseTool):
    """Echoes its argument after `delay` seconds (or raises); records its lifecycle and peak concurrency (calls run
    on threads of their own, so the counters are guarded by a lock)."""

    def __init__(self, name: str = "echo", delay: float = 0.0, error: Exception | None = None, timeout: float = 30):
        super().__init__(config={"timeout": timeout}, tool_schema=schema(name))
        self.delay, self.error = delay, error
        self.created: list[dict[str, Any]] = []
        self.executed: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.released: list[str] = []
        self.running = self.peak_running = 0
        self._lock = threading.Lock()

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        self.created.append(kwargs)
        return await super().create(instance_id, **kwargs)

    async def execute(self, instance_id, parameters, **kwargs):
        with self._lock:
            self.executed.append((parameters, kwargs))
            self.running += 1
            self.peak_running = max(self.peak_running, self.running)
        try:
            await asyncio.sleep(self.delay)
            if self.error is not None:
                raise self.error
        finally:
            with self._lock:
                self.running -= 1
        return ToolResponse(text=f"echo:{parameters['x']}"), 0.5, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 2.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.released.append(instance_id)
        await super().release(instance_id, **kwargs)


def run_loop(context, **row: Any):
    row.setdefault("raw_prompt", QUESTION)
    params = SamplingParams(temperature=1.0, max_tokens=context.response_length)
    return asyncio.run(ToolAgentLoop(context).run(params, request_id="conv-0", **row))


def model_part(output) -> tuple[list[int], list[float]]:
    """Response tokens and log-probs under mask 1."""
    kept = [(t, lp) for t, lp, m in zip(output.response_ids, output.response_log_probs, output.response_mask) if m]
    return [t for t, _ in kept], [lp for _, lp in kept]


def test_no_tool_call_ends_after_one_turn_with_all_tokens_in_the_loss(make_server, make_context):
    server = make_server(["The answer is 5."])
    output = run_loop(make_context(server, tools=[CalculatorTool()]))
    assert output.finish_reason == "stop"
    assert output.num_turns == 2
    assert all(m == 1 for m in output.response_mask)
    assert model_part(output) == tuple(map(list, zip(*server.emitted["conv-0"], strict=True)))


def test_one_tool_call_appends_the_tool_response_under_mask_zero(make_server, make_context, call_text, tokenizer):
    server = make_server([call_text("calculator", expression="2 + 3"), "It is 5."])
    output = run_loop(make_context(server, tools=[CalculatorTool()]))
    assert output.finish_reason == "stop" and output.num_turns == 4
    assert output.metrics.num_tool_calls == 1 and output.metrics.num_failed_tool_calls == 0
    ids, log_probs = model_part(output)
    emitted_ids, emitted_log_probs = map(list, zip(*server.emitted["conv-0"], strict=True))
    assert (ids, log_probs) == (emitted_ids, emitted_log_probs)
    tool_tokens = [t for t, m in zip(output.response_ids, output.response_mask) if m == 0]
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(tool_tokens, skip_special_tokens=False)
    assert all(lp == 0.0 for lp, m in zip(output.response_log_probs, output.response_mask) if m == 0)
    # the second turn was generated from the prompt, the first turn and the tool response
    second_prompt = server.calls[1]["prompt_ids"]
    assert second_prompt == output.prompt_ids + output.response_ids[: len(second_prompt) - len(output.prompt_ids)]


def test_parallel_calls_run_concurrently_and_are_bounded_by_max_parallel_calls(make_server, make_context, call_text):
    tool = RecordingTool(delay=0.2)
    calls = "\n".join(call_text("echo", x=str(i)) for i in range(3))
    server = make_server([calls, "done"])
    output = run_loop(make_context(server, tools=[tool], max_parallel_calls=2))
    assert sorted(params["x"] for params, _ in tool.executed) == ["0", "1"]  # started together, in no fixed order
    assert tool.peak_running == 2
    assert output.metrics.num_tool_calls == 2 and output.metrics.num_dropped_tool_calls == 1
    assert output.extra_fields["tool_rewards"] == [0.5, 0.5]


def test_a_tool_that_raises_becomes_an_error_message_in_the_conversation(
    make_server, make_context, call_text, tokenizer
):
    tool = RecordingTool(error=RuntimeError("disk on fire"))
    server = make_server([call_text("echo", x="1"), "sorry"])
    output = run_loop(make_context(server, tools=[tool]))
    assert output.finish_reason == "stop" and output.metrics.num_failed_tool_calls == 1
    text = tokenizer.decode(output.response_ids, skip_special_tokens=False)
    assert f"{TOOL_ERROR_PREFIX}disk on fire" in text
    assert tool.released, "release runs after a failing call"


def test_a_tool_that_hangs_is_cut_off_by_its_timeout(make_server, make_context, call_text, tokenizer):
    tool = RecordingTool(delay=60, timeout=0.5)
    server = make_server([call_text("echo", x="1"), "ok"])
    output = run_loop(make_context(server, tools=[tool]))
    text = tokenizer.decode(output.response_ids, skip_special_tokens=False)
    assert f"{TOOL_ERROR_PREFIX}echo timed out after 0.5 seconds" in text
    assert output.finish_reason == "stop" and tool.running == 0


def test_unknown_tools_and_missing_arguments_become_error_messages(make_server, make_context, call_text, tokenizer):
    server = make_server([call_text("nope", x="1") + "\n" + call_text("echo", y="1"), "ok"])
    output = run_loop(make_context(server, tools=[RecordingTool()], max_parallel_calls=2))
    text = tokenizer.decode(output.response_ids, skip_special_tokens=False)
    assert f"{TOOL_ERROR_PREFIX}unknown tool 'nope'; available tools: ['echo']" in text
    assert f"{TOOL_ERROR_PREFIX}echo is missing required arguments ['x']" in text
    assert output.metrics.num_failed_tool_calls == 2


def test_malformed_tool_calls_are_skipped_and_counted_without_crashing(make_server, make_context):
    server = make_server(['<tool_call>{"name": "echo", "arguments": {oops}</tool_call> and <tool_call>{"name'])
    tool = RecordingTool()
    output = run_loop(make_context(server, tools=[tool]))
    assert output.finish_reason == "stop"
    assert output.metrics.num_malformed_tool_calls == 2 and not tool.executed


def test_tools_kwargs_reach_create_and_execute_and_release_always_runs(make_server, make_context, call_text):
    tool = RecordingTool()
    server = make_server([call_text("echo", x="1"), "done"])
    tools_kwargs = {"echo": {"create_kwargs": {"ground_truth": "5"}, "execute_kwargs": {"mode": "fast"}}}
    output = run_loop(make_context(server, tools=[tool]), tools_kwargs=tools_kwargs)
    assert tool.created == [{"ground_truth": "5"}]
    assert tool.executed == [({"x": "1"}, {"mode": "fast"})]
    assert len(tool.released) == 1 and tool.instances == {}
    assert output.extra_fields["tool_scores"] == {"echo": 2.0}


def test_release_runs_when_the_episode_fails(make_context, call_text):
    class FailingServer:
        async def generate(self, request_id, prompt_ids, sampling_params):
            raise ConnectionError("server went away")

    tool = RecordingTool()
    with pytest.raises(ConnectionError):
        run_loop(make_context(FailingServer(), tools=[tool]))
    assert len(tool.created) == 1 and len(tool.released) == 1


def test_tool_selection_shows_and_allows_only_the_selected_tools(make_server, make_context, call_text, tokenizer):
    first, second = RecordingTool("first"), RecordingTool("second")
    server = make_server([call_text("second", x="1"), "done"])
    output = run_loop(make_context(server, tools=[first, second]), extra_info={"tool_selection": ["first"]})
    prompt = tokenizer.decode(output.prompt_ids, skip_special_tokens=False)
    assert '"name": "first"' in prompt and '"name": "second"' not in prompt
    assert not second.executed and not second.created
    assert "unknown tool 'second'" in tokenizer.decode(output.response_ids, skip_special_tokens=False)


def test_tool_selection_naming_an_undeclared_tool_is_a_clear_error(make_server, make_context):
    with pytest.raises(ValueError, match=r"tool_selection=\['search'\].*declared tools: \['echo'\]"):
        run_loop(make_context(make_server(["x"]), tools=[RecordingTool()]), extra_info={"tool_selection": ["search"]})


def test_max_assistant_turns_ends_the_episode(make_server, make_context, call_text):
    server = make_server([call_text("echo", x="again")])  # the model never stops calling
    output = run_loop(make_context(server, tools=[RecordingTool()], max_assistant_turns=3))
    assert output.finish_reason == "max_turns"
    assert len(server.calls) == 3 and output.metrics.num_tool_calls == 2


def answer_check(**config: Any) -> dict[str, AnswerCheckInteraction]:
    return {"answer_check": AnswerCheckInteraction("answer_check", config)}


GSM8K_KWARGS = {"name": "answer_check", "ground_truth": "5", "data_source": "openai/gsm8k"}


def test_interaction_feedback_then_a_correct_answer_ends_the_episode(make_server, make_context, tokenizer):
    server = make_server(["#### 4", "#### 5", "#### 6"])
    output = run_loop(make_context(server, interactions=answer_check()), interaction_kwargs=GSM8K_KWARGS)
    assert output.finish_reason == "stop" and len(server.calls) == 2
    assert output.extra_fields["turn_scores"] == [0.0, 1.0]
    user_tokens = [t for t, m in zip(output.response_ids, output.response_mask) if m == 0]
    assert "Your answer is incorrect" in tokenizer.decode(user_tokens)
    assert output.num_turns == 4  # prompt, answer, feedback, answer


def test_interaction_kwargs_can_come_from_extra_info(make_server, make_context):
    server = make_server(["#### 5"])
    context = make_context(server, interactions=answer_check())
    output = run_loop(context, extra_info={"interaction_kwargs": GSM8K_KWARGS})
    assert output.extra_fields["turn_scores"] == [1.0]


def test_max_user_turns_ends_the_episode(make_server, make_context):
    server = make_server(["#### 1"])  # always wrong
    context = make_context(server, interactions=answer_check(), max_user_turns=2)
    output = run_loop(context, interaction_kwargs=GSM8K_KWARGS)
    assert output.finish_reason == "max_turns"
    assert len(server.calls) == 3 and output.extra_fields["turn_scores"] == [0.0, 0.0, 0.0]


def test_an_unknown_interaction_name_is_a_clear_error(make_server, make_context):
    context = make_context(make_server(["x"]), interactions=answer_check())
    with pytest.raises(ValueError, match=r"interaction_kwargs.name='judge'.*configured: \['answer_check'\]"):
        run_loop(context, interaction_kwargs={"name": "judge"})


def test_response_length_limit_cuts_tokens_mask_and_log_probs_together(make_server, make_context, call_text):
    tool = RecordingTool()
    server = make_server([call_text("echo", x="y" * 200), "never reached"])
    context = make_context(server, tools=[tool], response_length=60, max_tool_response_length=1000)
    output = run_loop(context)
    assert output.finish_reason == "length"
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_log_probs) == 60
    assert all((lp != 0.0) == (m == 1) for lp, m in zip(output.response_log_probs, output.response_mask))


def test_generation_is_limited_to_the_remaining_response_budget(make_server, make_context, call_text):
    server = make_server([call_text("echo", x="1"), "a long final answer " * 20])
    output = run_loop(make_context(server, tools=[RecordingTool()], response_length=80))
    used_before_second_turn = len(server.calls[1]["prompt_ids"]) - len(output.prompt_ids)
    assert server.calls[1]["params"].max_tokens == 80 - used_before_second_turn
    assert output.finish_reason == "length" and len(output.response_ids) == 80


@pytest.mark.parametrize(
    ("side", "expected"),
    [
        ("left", "(truncated)...qrstuvwxyz"),
        ("right", "echo:abcde...(truncated)"),
        ("middle", "echo:\n...(truncated)...\nvwxyz"),
    ],
)
def test_tool_responses_are_cut_on_the_configured_side(make_server, make_context, call_text, tokenizer, side, expected):
    server = make_server([call_text("echo", x="abcdefghijklmnopqrstuvwxyz"), "done"])
    context = make_context(
        server, tools=[RecordingTool()], max_tool_response_length=10, tool_response_truncate_side=side
    )
    output = run_loop(context)
    text = tokenizer.decode(output.response_ids, skip_special_tokens=False)
    assert f"<tool_response>\n{expected}\n</tool_response>" in text


def test_a_turn_cut_short_by_the_engine_ends_the_episode_without_running_its_calls(
    make_server, make_context, call_text
):
    server = make_server([call_text("echo", x="1")], add_eos=False)  # the engine reports finish_reason "length"
    tool = RecordingTool()
    output = run_loop(make_context(server, tools=[tool]))
    assert output.finish_reason == "length" and len(server.calls) == 1 and not tool.executed


def test_a_function_tool_from_a_python_file_is_called_like_any_tool(make_server, make_context, call_text, tmp_path):
    (tmp_path / "weather.py").write_text(
        "from hyflow.agent.tools.function_tool import function_tool\n\n\n"
        "@function_tool\n"
        "def get_weather(city: str) -> tuple[dict, float]:\n"
        '    """The weather of a city.\n\n    Args:\n        city: the city.\n    """\n'
        '    return {"city": city, "sky": "drizzle"}, 0.25\n'
    )
    tools = load_all_tools(None, tmp_path / "weather.py")
    server = make_server([call_text("get_weather", city="Oslo"), "Drizzle."])
    output = run_loop(make_context(server, tools=tools))
    assert output.finish_reason == "stop" and output.metrics.num_tool_calls == 1
    assert output.extra_fields["tool_rewards"] == [0.25] and output.extra_fields["tool_scores"] == {"get_weather": 0.0}
    assert '{"city": "Oslo", "sky": "drizzle"}' in server.tokenizer.decode(server.calls[1]["prompt_ids"])


def test_a_turn_with_calls_is_kept_as_an_openai_message_with_the_calls_that_run(make_server, make_context):
    context = make_context(make_server(["unused"]), tools=[CalculatorTool()], max_parallel_calls=1)
    loop = ToolAgentLoop(context)
    calls = [FunctionCall.of("calculator", {"expression": "1+1"}, tool_call_id="call-0"), FunctionCall("calculator")]
    data = AgentData(request_id="r", messages=[], tool_calls=calls)
    assert loop._build_assistant_message("Computing.", data) == {
        "role": "assistant",
        "content": "Computing.",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+1"}}, "id": "call-0"}
        ],
    }
    assert loop._build_assistant_message("Done.", AgentData(request_id="r", messages=[])) == {
        "role": "assistant",
        "content": "Done.",
    }


def test_arguments_that_are_not_a_json_object_reach_the_model_as_an_error(
    make_server, make_context, call_text, tokenizer
):
    class LooseParser(ToolParser):
        """Passes the text after `call:` on as the arguments, unchecked (as a careless custom parser would)."""

        def parse(self, text, tools=None):
            return ParsedToolCalls("", [FunctionCall("echo", text.partition("call:")[2])] if "call:" in text else [])

    tool = RecordingTool()
    context = make_context(make_server(["call:{x: 1}", "sorry"]), tools=[tool])
    context.tool_parser = LooseParser(tokenizer)
    output = run_loop(context)
    text = tokenizer.decode(output.response_ids, skip_special_tokens=False)
    assert f"{TOOL_ERROR_PREFIX}Invalid JSON in arguments for 'echo'" in text and not tool.executed
    assert output.metrics.num_failed_tool_calls == 1


def test_the_conversation_keeps_the_models_call_ids_on_the_call_and_on_its_tool_response(make_server, make_context):
    class IdParser(ToolParser):
        """`echo:ID` calls echo with the model's call id ID."""

        def parse(self, text, tools=None):
            calls = [FunctionCall.of("echo", {"x": "1"}, tool_call_id=text.split(":")[1])] if "echo:" in text else []
            return ParsedToolCalls(text.split("echo:")[0], calls)

    class Recording(BaseInteraction):
        async def generate_response(self, instance_id, messages, **kwargs):
            self.seen = [dict(message) for message in messages]
            return True, "", 0.0, {}

    interaction = Recording("recording")
    context = make_context(make_server(["Let me see. echo:call-7", "done"]), tools=[RecordingTool()])
    context.tool_parser, context.interactions = IdParser(None), {"recording": interaction}
    run_loop(context, interaction_kwargs={"name": "recording"})
    assistant, tool = interaction.seen[-3], interaction.seen[-2]
    assert assistant["content"] == "Let me see. " and assistant["tool_calls"][0]["id"] == "call-7"
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call-7"
