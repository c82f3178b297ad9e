"""Forced tool choice for every registered tool parser: a named `tool_choice` and "required" start the assistant
turn with the opening of a call in the server's parser's own format, the (scripted) model writes the rest, and the
reply, whole or streamed, carries the call; a parser that cannot start a call makes such a choice a 400 naming it."""

from __future__ import annotations

import json

import openai
import pytest

from hyflow.agent.parsers import ParsedToolCalls, ToolParser
from hyflow.serving import build_app
from hyflow.serving.errors import BadRequest
from hyflow.serving.requests import tool_call_prefix
from hyflow.serving.schema import ChatCompletionRequest
from hyflow.serving.server import BackgroundServer

from .conftest import MODEL, make_state
from .serving_testkit import ScriptedAsyncEngine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
    for name in ("calculator", "search")
]
ASK = [{"role": "user", "content": "what is 7*6?"}]
NAMED = {"type": "function", "function": {"name": "calculator"}}

# One well-formed call of calculator({"expression": "7*6"}) in each built-in format, written out by hand.
CALLS = {
    "hermes": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "7*6"}}\n</tool_call>',
    "qwen3_coder": (
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n7*6\n</parameter>\n</function>\n</tool_call>"
    ),
    "kimi": (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.calculator:0<|tool_call_argument_begin|>"
        '{"expression": "7*6"}<|tool_call_end|><|tool_calls_section_end|>'
    ),
    "gpt-oss": (
        '<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{"expression": "7*6"}<|call|>'
    ),
}
CALLS["kimi_k2"] = CALLS["kimi"]
# Kimi K2's and harmony's markers are special tokens of their tokenizers: so they are of this one.
SPECIAL_MARKERS = [
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|call|>",
]


class CallCompletingEngine(ScriptedAsyncEngine):
    """A model forced to finish the call its prompt started: it replies with what `call` has beyond the longest
    end of the prompt that `call` starts with (all of `call` when the prompt started none of it)."""

    def __init__(self, engine, call: str) -> None:
        super().__init__(engine, call)
        self.call = call

    def _finish(self, prompt_token_ids) -> None:
        prompt = self.engine.tokenizer.decode(prompt_token_ids, skip_special_tokens=False)
        started = max((k for k in range(len(self.call) + 1) if prompt.endswith(self.call[:k])), default=0)
        self.started, self.reply = self.call[:started], self.call[started:]

    async def generate(self, prompt_token_ids, params=None, request_id=None, multi_modal_inputs=None):
        self._finish(prompt_token_ids)
        return await super().generate(prompt_token_ids, params, request_id, multi_modal_inputs)

    async def stream(self, prompt_token_ids, params=None, request_id=None, multi_modal_inputs=None, detokenize=False):
        self._finish(prompt_token_ids)
        async for output in super().stream(prompt_token_ids, params, request_id, multi_modal_inputs, detokenize):
            yield output


@pytest.fixture(scope="module")
def served(model_path):
    state = make_state(model_path)
    state.tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_MARKERS})
    with BackgroundServer(build_app(state)) as server:
        yield state, openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def test_every_built_in_parser_has_a_call_written_out_here():
    built_in = [name for name in ToolParser.names() if ToolParser._registry[name].__module__.startswith("hyflow.")]
    assert sorted(CALLS) == built_in and set(built_in) <= set(ToolParser.forceable_names())


def _ask(client, tool_choice, stream: bool):
    kwargs = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 200}
    if not stream:
        return client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    chunks = client.chat.completions.create(**kwargs, stream=True)
    return [call for chunk in chunks for call in (chunk.choices[0].delta.tool_calls or [])]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
@pytest.mark.parametrize("parser_name", sorted(CALLS))
def test_a_forced_tool_choice_starts_a_call_in_the_parsers_own_format(
    served, monkeypatch, parser_name, tool_choice, stream
):
    state, client = served
    monkeypatch.setattr(state, "tool_parser", ToolParser.get(parser_name, state.tokenizer))
    engine = CallCompletingEngine(state.engine, CALLS[parser_name])
    monkeypatch.setattr(state, "async_engine", engine)
    (call,) = _ask(client, tool_choice, stream)
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "7*6"}
    if tool_choice == "required":
        assert engine.started and "calculator" not in engine.started  # a call was opened; the model named the tool
    else:
        assert "calculator" in engine.started  # the server wrote the name, so the model could call no other tool


def test_kimi_k2_numbers_a_forced_call_after_the_conversations_earlier_calls():
    history = [
        *ASK,
        {"role": "assistant", "tool_calls": [{"id": "c0", "function": {"name": "search", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "nothing"},
    ]
    request = ChatCompletionRequest(model=MODEL, messages=history, tools=TOOLS, tool_choice=NAMED)
    prefix = tool_call_prefix(ToolParser.get("kimi_k2", None), request)
    assert prefix.endswith("functions.calculator:1<|tool_call_argument_begin|>")


class BracketParser(ToolParser):
    """A format that reads `[name]` calls but does not say how to start one."""

    def parse(self, text, tools=None) -> ParsedToolCalls:
        return ParsedToolCalls(text, [])


@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
def test_a_parser_that_cannot_start_a_call_makes_a_forced_choice_a_400_naming_it_and_the_way_out(
    served, monkeypatch, tool_choice
):
    state, client = served
    monkeypatch.setattr(state, "tool_parser", BracketParser(state.tokenizer))
    monkeypatch.setattr(state, "async_engine", ScriptedAsyncEngine(state.engine, "no call"))
    with pytest.raises(openai.BadRequestError, match=r"'BracketParser' cannot start one.*'auto'.*hermes"):
        _ask(client, tool_choice, stream=False)
    assert _ask(client, "auto", stream=False) is None  # the parser still reads replies under tool_choice='auto'
    with pytest.raises(BadRequest, match="qwen3_coder"):
        tool_call_prefix(BracketParser(None), ChatCompletionRequest(model=MODEL, messages=ASK, tool_choice="required"))
