"""ToolAgentLoop with tools that misbehave in every hook: each hook is bounded by the tool's timeout, whatever it
raises becomes text or a counted failure, and the episode (so the batch) goes on."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from hyflow.agent.tool_agent import TOOL_ERROR_PREFIX
from hyflow.agent.tools import hook_runner
from tests.agent.test_tool_agent import RecordingTool, run_loop

pytestmark = pytest.mark.timeout(60)


class BlockingTool(RecordingTool):
    """`execute` blocks its thread (a synchronous wait inside `async def`) until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__(timeout=0.5)
        self.gate = threading.Event()

    async def execute(self, instance_id, parameters, **kwargs):
        self.executed.append((parameters, kwargs))
        self.gate.wait(5)
        return await super().execute(instance_id, parameters, **kwargs)


class FailingHookTool(RecordingTool):
    """One hook (`hook`) hangs past the 0.5 s timeout ("timeout") or raises ("raised"); the others work."""

    def __init__(self, hook: str, kind: str) -> None:
        super().__init__(timeout=0.5)
        self.failing_hook, self.kind = hook, kind

    async def _maybe_fail(self, hook: str) -> None:
        if hook == self.failing_hook:
            if self.kind == "raised":
                raise RuntimeError(f"broken {hook}")
            await asyncio.sleep(3)

    async def create(self, instance_id: str | None = None, **kwargs: Any):
        await self._maybe_fail("create")
        return await super().create(instance_id, **kwargs)

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        await self._maybe_fail("calc_reward")
        return await super().calc_reward(instance_id, **kwargs)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        await self._maybe_fail("release")
        await super().release(instance_id, **kwargs)


def test_an_execute_that_blocks_the_event_loop_is_cut_off_counted_and_its_tool_taken_out_of_service(
    make_server, make_context, call_text, tokenizer, monkeypatch
):
    monkeypatch.setattr(hook_runner, "ABANDON_GRACE_S", 0.1)
    tool = BlockingTool()
    server = make_server([call_text("echo", x="1"), call_text("echo", x="2"), "done"])
    try:
        output = run_loop(make_context(server, tools=[tool]))
    finally:
        tool.gate.set()
    text = tokenizer.decode(output.response_ids, skip_special_tokens=False)
    assert f"{TOOL_ERROR_PREFIX}echo timed out after 0.5 seconds" in text
    assert f"{TOOL_ERROR_PREFIX}echo is unavailable for the rest of this episode" in text
    assert output.finish_reason == "stop" and len(tool.executed) == 1  # the second call never reached the tool
    assert output.metrics.tool_hook_failures == {"execute/timeout": 1}
    assert output.metrics.num_abandoned_tool_threads == 1 and output.metrics.num_failed_tool_calls == 2
    assert output.extra_fields["tool_scores"] == {"echo": 0.0} and len(tool.released) == 1


@pytest.mark.parametrize("error", [SystemExit(3), GeneratorExit(), KeyboardInterrupt()])
def test_a_tool_that_raises_a_base_exception_becomes_an_error_message_not_the_end_of_the_batch(
    make_server, make_context, call_text, tokenizer, error
):
    tool = RecordingTool(error=error)
    server = make_server([call_text("echo", x="1"), "sorry"])
    output = run_loop(make_context(server, tools=[tool]))
    text = tokenizer.decode(output.response_ids, skip_special_tokens=False)
    assert f"{TOOL_ERROR_PREFIX}echo raised {type(error).__name__}" in text
    assert output.finish_reason == "stop" and output.metrics.tool_hook_failures == {"execute/raised": 1}


@pytest.mark.parametrize("kind", ["timeout", "raised"])
@pytest.mark.parametrize("hook", ["create", "calc_reward", "release"])
def test_a_failing_create_calc_reward_or_release_is_counted_and_the_episode_goes_on(
    make_server, make_context, call_text, tokenizer, hook, kind
):
    tool = FailingHookTool(hook, kind)
    server = make_server([call_text("echo", x="1"), "done"])
    output = run_loop(make_context(server, tools=[tool]))
    assert output.finish_reason == "stop"
    assert output.metrics.tool_hook_failures == {f"{hook}/{kind}": 1}
    text = tokenizer.decode(output.response_ids, skip_special_tokens=False)
    if hook == "create":  # no instance: its calls answer with the reason, nothing to score or release
        why = "echo.create timed out after 0.5 seconds" if kind == "timeout" else "broken create"
        assert f"{TOOL_ERROR_PREFIX}echo is unavailable in this episode: {why}" in text
        assert output.extra_fields["tool_scores"] == {} and not tool.executed and not tool.released
    else:
        assert "echo:1" in text
        assert output.extra_fields["tool_scores"] == {"echo": 0.0 if hook == "calc_reward" else 2.0}


def test_an_execute_that_returns_the_wrong_shape_reaches_the_model_as_an_error(
    make_server, make_context, call_text, tokenizer
):
    class WrongShapeTool(RecordingTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return "just text"

    server = make_server([call_text("echo", x="1"), "ok"])
    output = run_loop(make_context(server, tools=[WrongShapeTool()]))
    text = tokenizer.decode(output.response_ids, skip_special_tokens=False)
    assert f"{TOOL_ERROR_PREFIX}tool echo returned 'just text' from execute" in text
    assert output.finish_reason == "stop" and output.metrics.tool_hook_failures == {"execute/raised": 1}
