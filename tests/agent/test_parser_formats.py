"""Tool-call formats of current model families: Qwen3 XML, Kimi K2, gpt-oss harmony (never raising on bad output)."""

from __future__ import annotations

import asyncio

import pytest

from hyflow.agent.parser_formats import KimiToolParser, Qwen3XMLToolParser
from hyflow.agent.parsers import FunctionCall, ParsedToolCalls, ToolParser
from hyflow.agent.tools.schemas import OpenAIFunctionPropertySchema, OpenAIFunctionToolSchema, request_tool_schemas

KIMI_CALL = (
    '<|tool_call_begin|>functions.get_weather:{i}<|tool_call_argument_begin|>{{"city": "{city}"}}<|tool_call_end|>'
)


class RecordingTokenizer:
    """Decodes to a fixed text and records whether special tokens were kept."""

    def __init__(self, text: str) -> None:
        self.text, self.skip_special_tokens = text, None

    def decode(self, ids, skip_special_tokens=False):
        self.skip_special_tokens = skip_special_tokens
        return self.text


def test_qwen3_coder_reads_each_parameter_as_json_when_it_parses_and_as_text_otherwise():
    text = (
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
        '<parameter=days>\n3\n</parameter>\n<parameter=units>\n{"temp": "C"}\n</parameter>\n</function>\n</tool_call>'
    )
    parsed = ToolParser.get("qwen3_coder", None).parse(text)
    assert parsed == ParsedToolCalls(
        "Checking.", [FunctionCall.of("get_weather", {"city": "San Francisco", "days": 3, "units": {"temp": "C"}})]
    )


def test_qwen3_coder_counts_a_block_without_a_function_and_an_unclosed_block():
    text = '<tool_call>{"name": "x"}</tool_call><tool_call><function=a></function></tool_call> <tool_call><function='
    parsed = ToolParser.get("qwen3_coder", None).parse(text)
    assert parsed.calls == [FunctionCall.of("a", {})]
    assert parsed.num_malformed == 2


def test_kimi_k2_parses_every_call_of_the_section_and_keeps_the_text_before_it():
    calls = KIMI_CALL.format(i=0, city="Paris") + KIMI_CALL.format(i=1, city="Oslo")
    text = f"Two cities.<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>"
    parsed = ToolParser.get("kimi_k2", None).parse(text + "<|im_end|>")
    assert parsed == ParsedToolCalls(
        "Two cities.",
        [
            FunctionCall.of("get_weather", {"city": "Paris"}, tool_call_id="functions.get_weather:0"),
            FunctionCall.of("get_weather", {"city": "Oslo"}, tool_call_id="functions.get_weather:1"),
        ],
    )


def test_kimi_k2_counts_bad_arguments_and_a_call_cut_off_by_the_length_limit():
    bad = "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{oops}<|tool_call_end|>"
    cut = '<|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{"a": '
    parsed = ToolParser.get("kimi_k2", None).parse(f"<|tool_calls_section_begin|>{bad}{cut}")
    assert parsed.calls == []
    assert parsed.num_malformed == 3  # bad JSON, the unfinished call, the unclosed section


def test_gpt_oss_reads_calls_from_the_commentary_channel_and_text_from_the_final_channel():
    text = (
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_current_weather <|constrain|>json"
        '<|message|>{"location": "Tokyo"}<|call|>'
    )
    parser = ToolParser.get("gpt-oss", None)
    assert parser.parse(text) == ParsedToolCalls("", [FunctionCall.of("get_current_weather", {"location": "Tokyo"})])
    assert parser.parse("<|channel|>final<|message|>Sunny, 20 C.<|return|>").text == "Sunny, 20 C."


@pytest.mark.parametrize(
    ("name", "keeps"), [("hermes", False), ("qwen3_coder", False), ("kimi_k2", True), ("gpt-oss", True)]
)
def test_formats_whose_markers_are_special_tokens_decode_with_special_tokens_kept(name, keeps):
    tokenizer = RecordingTokenizer("plain text")
    asyncio.run(ToolParser.get(name, tokenizer).extract_tool_calls([1, 2, 3]))
    assert tokenizer.skip_special_tokens is (not keeps)


def schema(name: str, **types: str) -> OpenAIFunctionToolSchema:
    properties = {key: {"type": kind} for key, kind in types.items()}
    return OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": "",
                "parameters": {"type": "object", "properties": properties, "required": list(types)},
            },
        }
    )


def test_qwen3_xml_reads_values_by_the_declared_types_of_the_tools_schema(tmp_path):
    marker = tmp_path / "pwned"
    code = f'__import__("os").system("touch {marker}")'
    values = {"zip": "02139", "n": "7", "x": "2.5", "ok": "False", "items": "['a', 'b']", "code": code, "gone": "null"}
    values["both"] = "0.5"  # declared int | float
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>" for key, value in values.items())
    tools = [
        schema("f", zip="string", n="integer", x="number", ok="boolean", items="array", code="array", gone="object")
    ]
    tools[0].function.parameters.properties["both"] = OpenAIFunctionPropertySchema(type=["integer", "number"])
    (call,) = (
        ToolParser.get("qwen3_coder", None).parse(f"<tool_call><function=f>{body}</function></tool_call>", tools).calls
    )
    assert call.arguments_dict() == {
        "zip": "02139",
        "n": 7,
        "x": 2.5,
        "ok": False,
        "items": ["a", "b"],
        "code": code,
        "gone": None,
        "both": 0.5,
    }
    assert not marker.exists()  # a literal is read with ast.literal_eval, never eval


def test_qwen3_xml_skips_a_cut_parameter_and_refuses_a_cut_function_header():
    parser = ToolParser.get("qwen3_coder", None)
    call = parser._parse_xml_function_call("f><parameter=a>1</parameter><parameter=cut", None)
    assert call.arguments_dict() == {"a": 1}
    assert parser._parse_xml_function_call("f", None) is None


def test_kimi_matches_a_call_id_that_names_no_tool_to_the_tool_it_contains_or_whose_arguments_it_fills():
    def section(call_id: str, arguments: str) -> str:
        call = f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"
        return f"<|tool_calls_section_begin|>{call}<|tool_calls_section_end|>"

    tools = [schema("get_weather", city="string"), schema("search", query="string")]
    parser = ToolParser.get("kimi", None)
    (call,) = parser.parse(section("call-get_weather-0", '{"city": "Oslo"}'), tools).calls
    assert (call.name, call.tool_call_id) == ("get_weather", "call-get_weather-0")
    assert parser.parse(section("call_7", '{"query": "rain"}'), tools).calls[0].name == "search"
    assert parser.parse(section("call_7", '{"query": "rain"}')).calls[0].name == "call_7"  # no schemas: as written


def test_the_parsers_carry_verls_class_names():
    assert isinstance(ToolParser.get("qwen3_coder", None), Qwen3XMLToolParser)
    assert type(ToolParser.get("kimi", None)) is type(ToolParser.get("kimi_k2", None)) is KimiToolParser


def test_qwen3_xml_types_the_values_of_an_openai_requests_tools_anyof_included():
    properties = {
        "n": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},  # pydantic's int | None
        "label": {"type": "string"},
        "flag": {"type": "boolean"},
    }
    tools = request_tool_schemas(
        [{"type": "function", "function": {"name": "f", "parameters": {"properties": properties}}}]
    )
    text = "<tool_call><function=f><parameter=n>3</parameter><parameter=label>3</parameter>"
    text += "<parameter=flag>True</parameter></function></tool_call>"
    (call,) = ToolParser.get("qwen3_coder", None).parse(text, tools).calls
    assert call.arguments_dict() == {"n": 3, "label": "3", "flag": True}


def test_request_tools_that_are_not_function_objects_are_refused_naming_the_tool():
    with pytest.raises(ValueError, match=r"tools\[1\] \('g'\).*function.parameters.properties"):
        request_tool_schemas(
            [
                {"type": "function", "function": {"name": "f"}},
                {"type": "function", "function": {"name": "g", "parameters": {"properties": [1]}}},
            ]
        )


@pytest.mark.parametrize("parser_name, call_end", [("gpt-oss", "<|call|>"), ("kimi_k2", "<|tool_call_end|>")])
@pytest.mark.parametrize("tool", ["web.search", "repo.lookup"])
def test_gpt_oss_and_kimi_read_a_tool_name_with_dots_whole_also_after_their_forced_call_prefix(
    parser_name, call_end, tool
):
    parser = ToolParser.get(parser_name, None)
    forced = parser.forced_call_prefix(tool) + '{"query": "hyflow"}' + call_end
    if parser_name == "kimi_k2":
        forced += "<|tool_calls_section_end|>"
    written = {
        "gpt-oss": f"<|channel|>commentary to=functions.{tool} <|constrain|>json"
        '<|message|>{"query": "hyflow"}<|call|>',
        "kimi_k2": f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{tool}:0<|tool_call_argument_begin|>"
        '{"query": "hyflow"}<|tool_call_end|><|tool_calls_section_end|>',
    }[parser_name]
    for text in (forced, written):
        assert [call.name for call in parser.parse(text).calls] == [tool]
