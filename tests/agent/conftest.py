"""Fixtures of the agent tests: the tiny tokenizer, a scripted generation server, and loop contexts.

`ScriptedServer` is a test double of `AsyncLLMServer`: it answers each turn of a conversation with the next
scripted text (tokenized, eos appended), cut to `max_tokens`, and gives every emitted token a distinct log-prob, so
tests can check that exactly the emitted tokens (and their log-probs) end up under response_mask 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from hyflow.agent.chat import MessageDelta
from hyflow.agent.loop import AgentLoopContext
from hyflow.agent.parsers import ToolParser
from hyflow.agent.server import TokenOutput
from hyflow.agent.tools import function_tool as function_tool_module
from hyflow.config.actor_rollout_ref import MultiTurnConfig
from hyflow.models.tiny import build_tiny_tokenizer

Script = list[str] | Callable[[str, int], str]


class ScriptedServer:
    """Answers turn k of every conversation with `script[k]` (or `script(prompt_text, k)`)."""

    def __init__(self, tokenizer: Any, script: Script, add_eos: bool = True, delay: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.add_eos = add_eos
        self.delay = delay
        self.calls: list[dict[str, Any]] = []
        self.turns: dict[str, int] = {}
        self.emitted: dict[str, list[tuple[int, float]]] = {}
        self._next_log_prob = 0
        self.in_flight = self.peak_in_flight = 0

    def _text(self, prompt_ids: list[int], turn: int) -> str:
        if callable(self.script):
            return self.script(self.tokenizer.decode(prompt_ids, skip_special_tokens=False), turn)
        return self.script[min(turn, len(self.script) - 1)]

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: Any, **vision) -> TokenOutput:
        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        call = {"request_id": request_id, "prompt_ids": list(prompt_ids), "params": sampling_params, **vision}
        self.calls.append(call)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        await asyncio.sleep(self.delay)  # also without delay: yield, as a real server does
        self.in_flight -= 1
        ids = self.tokenizer.encode(self._text(prompt_ids, turn), add_special_tokens=False)
        ids = [*ids, self.tokenizer.eos_token_id] if self.add_eos else ids
        finish = "stop" if self.add_eos else "length"
        if len(ids) > sampling_params.max_tokens:
            ids, finish = ids[: sampling_params.max_tokens], "length"
        log_probs = []
        for _ in ids:
            self._next_log_prob += 1
            log_probs.append(-self._next_log_prob / 1000)
        self.emitted.setdefault(request_id, []).extend(zip(ids, log_probs))
        return TokenOutput(token_ids=ids, log_probs=log_probs, finish_reason=finish)


@pytest.fixture(autouse=True)
def _isolated_function_tool_registry():
    """Each test sees the function-tool registry (and the loaded-files cache) as it was before it, and leaves it so."""
    registry, loaded = function_tool_module.FUNCTION_TOOL_REGISTRY, function_tool_module._LOADED_FUNCTION_TOOL_PATHS
    saved_registry, saved_loaded = dict(registry), dict(loaded)
    yield
    registry.clear()
    registry.update(saved_registry)
    loaded.clear()
    loaded.update(saved_loaded)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture
def make_server(tokenizer) -> Callable[..., ScriptedServer]:
    def make(script: Script, **kwargs: Any) -> ScriptedServer:
        return ScriptedServer(tokenizer, script, **kwargs)

    return make


@pytest.fixture
def make_context(tokenizer) -> Callable[..., AgentLoopContext]:
    """An AgentLoopContext over a server, with tools / interactions given as lists and multi_turn overrides."""

    def make(
        server, tools=(), interactions=None, response_length: int = 256, processor=None, **multi_turn: Any
    ) -> AgentLoopContext:
        config = MultiTurnConfig(enable=True, **multi_turn)
        tok = processor.tokenizer if processor is not None else tokenizer
        return AgentLoopContext(
            server=server,
            tokenizer=tok,
            response_length=response_length,
            multi_turn=config,
            tool_parser=ToolParser.get(config.format, tok),
            message_delta=MessageDelta(tok),
            tools={tool.name: tool for tool in tools},
            interactions=dict(interactions or {}),
            processor=processor,
        )

    return make


def tool_call(name: str, **arguments: Any) -> str:
    """A Hermes tool call as the model would write it."""
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture
def call_text() -> Callable[..., str]:
    return tool_call
