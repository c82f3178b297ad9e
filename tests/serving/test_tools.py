"""Tool calls in chat replies: `tools` reach the chat template, the server's parser (`--tool-call-parser hermes`)
fills `tool_calls`, finish_reason is "tool_calls"; `tool_choice` none / auto / required / named; the tools reach
the parser too, so qwen3_coder's XML values come back as their declared types."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hyflow.agent.parsers import ToolParser
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


XML_CALL = (
    "<tool_call>\n<function=repeat>\n<parameter=n>\n3\n</parameter>\n<parameter=word>\n3\n</parameter>\n"
    "<parameter=loud>\nTrue\n</parameter>\n</function>\n</tool_call>"
)
REPEAT = {
    "type": "function",
    "function": {
        "name": "repeat",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "word": {"type": "string"}, "loud": {"type": "boolean"}},
        },
    },
}
TYPED = '{"n": 3, "word": "3", "loud": true}'  # untyped, the parser would guess {"n": 3, "word": 3, "loud": "True"}


@pytest.fixture(scope="module")
def qwen3_coder(model_path):
    state = make_state(model_path)
    state.tool_parser = ToolParser.get("qwen3_coder", state.tokenizer)
    state.async_engine = ScriptedAsyncEngine(state.engine, XML_CALL)
    with BackgroundServer(build_app(state)) as server:
        yield openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def test_the_request_tools_reach_the_parser_so_xml_values_come_back_as_their_declared_types(qwen3_coder):
    response = qwen3_coder.chat.completions.create(model=MODEL, messages=ASK, tools=[REPEAT], max_tokens=200)
    (call,) = response.choices[0].message.tool_calls
    assert call.function.name == "repeat" and call.function.arguments == TYPED


def test_a_streamed_xml_call_comes_back_typed_too(qwen3_coder):
    stream = qwen3_coder.chat.completions.create(model=MODEL, messages=ASK, tools=[REPEAT], max_tokens=200, stream=True)
    calls = [call for chunk in stream for call in (chunk.choices[0].delta.tool_calls or [])]
    assert [(call.function.name, call.function.arguments) for call in calls] == [("repeat", TYPED)]


def test_a_tool_whose_parameters_are_not_an_object_schema_is_a_400_naming_it(qwen3_coder):
    bad = {"type": "function", "function": {"name": "repeat", "parameters": {"properties": ["n"]}}}
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\] \('repeat'\).*parameters.properties"):
        qwen3_coder.chat.completions.create(model=MODEL, messages=ASK, tools=[bad], max_tokens=20)
