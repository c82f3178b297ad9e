"""Tool calls in chat replies: `tools` reach the chat template, the server's parser (`--tool-call-parser hermes`)
fills `tool_calls`, finish_reason is "tool_calls"; `tool_choice` none / auto / required / named."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hyflow.serving import build_app
from hyflow.serving.server import BackgroundServer

from .conftest import MODEL, make_state
from .serving_testkit import ScriptedAsyncEngine

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "evaluates an arithmetic expression",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
ASK = [{"role": "user", "content": "what is 2+3?"}]
CALLED = {"name": "calculator", "arguments": '{"expression": "2+3"}'}


@pytest.fixture(scope="module")
def scripted(model_path):
    state = make_state(model_path)
    state.async_engine = ScriptedAsyncEngine(state.engine, "Let me compute." + CALL)
    with BackgroundServer(build_app(state)) as server:
        yield state, openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def test_a_reply_with_a_call_has_tool_calls_and_finish_reason_tool_calls(scripted):
    state, client = scripted
    response = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=200)
    ChatCompletion.model_validate(response.model_dump())
    choice = response.choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me compute."
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "2+3"}
    assert '"name": "calculator"' in state.tokenizer.decode(state.async_engine.prompts[-1])  # the template got them


def test_a_streamed_reply_with_a_call_sends_it_with_the_finish_reason(scripted):
    _, client = scripted
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=200, stream=True)
    chunks = [ChatCompletionChunk.model_validate(chunk.model_dump()) for chunk in stream]
    calls = [call for chunk in chunks for call in (chunk.choices[0].delta.tool_calls or [])]
    assert [(c.index, c.function.name) for c in calls] == [(0, "calculator")]
    assert json.loads(calls[0].function.arguments) == {"expression": "2+3"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_renders_no_tools_and_reads_no_calls(scripted):
    state, client = scripted
    response = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none")
    assert response.choices[0].message.tool_calls is None and response.choices[0].finish_reason == "stop"
    assert "calculator" not in state.tokenizer.decode(state.async_engine.prompts[-1])


def test_a_named_tool_choice_starts_the_call_for_the_model(scripted):
    state, client = scripted
    continuation = '{"expression": "7*6"}}\n</tool_call>'
    state.async_engine.reply, before = continuation, state.async_engine.reply
    try:
        choice = {"type": "function", "function": {"name": "calculator"}}
        response = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice)
    finally:
        state.async_engine.reply = before
    prompt = state.tokenizer.decode(state.async_engine.prompts[-1])
    assert prompt.endswith('<tool_call>\n{"name": "calculator", "arguments": ')
    (call,) = response.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"expression": "7*6"}


def test_a_history_with_calls_and_tool_results_renders(scripted):
    state, client = scripted
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    assert "<tool_response>\n5\n</tool_response>" in state.tokenizer.decode(state.async_engine.prompts[-1])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tool_choice": "required"}, "needs at least one tool"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "search"}}}, "not among the tools"),
    ],
)
def test_tool_choices_that_cannot_be_met_are_a_400(scripted, kwargs, message):
    _, client = scripted
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(model=MODEL, messages=ASK, **kwargs)


def test_tools_without_a_parser_on_the_server_name_the_flag(scripted, monkeypatch):
    state, client = scripted
    monkeypatch.setattr(state, "tool_parser", None)
    with pytest.raises(openai.BadRequestError, match="--tool-call-parser hermes"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS)
