"""Tool-call parsers: the Hermes format, malformed calls (skipped and counted, never raised), the registry."""

from __future__ import annotations

import asyncio

import pytest

from hyflow.agent.parsers import FunctionCall, HermesToolParser, ParsedToolCalls, ToolParser


@pytest.fixture
def hermes(tokenizer) -> ToolParser:
    return ToolParser.get("hermes", tokenizer)


def test_hermes_parses_one_call_and_keeps_the_text_around_it(hermes):
    parsed = hermes.parse(
        'Let me add.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
    )
    assert parsed == ParsedToolCalls("Let me add.", [FunctionCall.of("calculator", {"expression": "1+2"})], 0)


def test_hermes_parses_several_calls_in_order(hermes):
    text = "".join(f'<tool_call>{{"name": "t{i}", "arguments": {{"i": {i}}}}}</tool_call>' for i in range(3))
    assert [(c.name, c.arguments_dict()) for c in hermes.parse(text).calls] == [
        ("t0", {"i": 0}),
        ("t1", {"i": 1}),
        ("t2", {"i": 2}),
    ]


def test_hermes_accepts_arguments_given_as_a_json_string_and_missing_arguments(hermes):
    parsed = hermes.parse(
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call><tool_call>{"name": "b"}</tool_call>'
    )
    assert parsed.calls == [FunctionCall.of("a", {"x": 1}), FunctionCall.of("b", {})]


@pytest.mark.parametrize(
    "payload",
    [
        '{"name": "a", "arguments": {oops}}',  # bad JSON
        '{"arguments": {"x": 1}}',  # no name
        '{"name": "", "arguments": {}}',  # empty name
        '{"name": "a", "arguments": [1, 2]}',  # arguments not an object
        '{"name": "a", "arguments": "not json"}',  # arguments string that is not JSON
        '["a", {"x": 1}]',  # not an object
    ],
)
def test_hermes_skips_and_counts_a_malformed_call_next_to_a_good_one(hermes, payload):
    parsed = hermes.parse(
        f'<tool_call>{payload}</tool_call> <tool_call>{{"name": "ok", "arguments": {{}}}}</tool_call>'
    )
    assert parsed.calls == [FunctionCall.of("ok", {})]
    assert parsed.num_malformed == 1


def test_hermes_counts_an_unclosed_tag_and_drops_it_from_the_text(hermes):
    parsed = hermes.parse('Thinking <tool_call>{"name": "a", "arguments": {"x": ')
    assert parsed == ParsedToolCalls("Thinking", [], 1)


def test_hermes_finds_nothing_in_plain_text(hermes):
    assert hermes.parse("The answer is 4.") == ParsedToolCalls("The answer is 4.", [], 0)


def test_extract_tool_calls_decodes_token_ids(hermes, tokenizer):
    ids = tokenizer.encode('ok <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call><|im_end|>')
    text, calls = asyncio.run(hermes.extract_tool_calls(ids))
    assert text == "ok" and calls == [FunctionCall.of("a", {"x": 1})]


def test_an_unknown_format_lists_the_registered_parsers(tokenizer):
    with pytest.raises(ValueError, match=r"multi_turn.format='json'.*'hermes'.*'qwen3_coder'"):
        ToolParser.get("json", tokenizer)


def test_a_registered_parser_is_selectable_by_name(tokenizer):
    @ToolParser.register("test_bracket")
    class BracketParser(ToolParser):
        def parse(self, text: str, tools=None) -> ParsedToolCalls:
            _name, _, rest = text.partition("[")
            return ParsedToolCalls("", [FunctionCall(rest.rstrip("]"))], 0)

    assert isinstance(ToolParser.get("test_bracket", tokenizer), BracketParser)
    assert ToolParser.get("test_bracket", tokenizer).parse("call[add]").calls == [FunctionCall("add")]
    with pytest.raises(ValueError, match="already registered"):
        ToolParser.register("test_bracket")(HermesToolParser)
