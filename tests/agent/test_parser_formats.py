"""Tool-call formats of current model families: Qwen3 XML, Kimi K2, gpt-oss harmony (never raising on bad output)."""

from __future__ import annotations

import pytest

from hyflow.agent.parsers import FunctionCall, ParsedToolCalls, ToolParser

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
        "Checking.", [FunctionCall("get_weather", {"city": "San Francisco", "days": 3, "units": {"temp": "C"}})]
    )


def test_qwen3_coder_counts_a_block_without_a_function_and_an_unclosed_block():
    text = '<tool_call>{"name": "x"}</tool_call><tool_call><function=a></function></tool_call> <tool_call><function='
    parsed = ToolParser.get("qwen3_coder", None).parse(text)
    assert parsed.calls == [FunctionCall("a", {})]
    assert parsed.num_malformed == 2


def test_kimi_k2_parses_every_call_of_the_section_and_keeps_the_text_before_it():
    calls = KIMI_CALL.format(i=0, city="Paris") + KIMI_CALL.format(i=1, city="Oslo")
    text = f"Two cities.<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>"
    parsed = ToolParser.get("kimi_k2", None).parse(text)
    assert parsed == ParsedToolCalls(
        "Two cities.", [FunctionCall("get_weather", {"city": "Paris"}), FunctionCall("get_weather", {"city": "Oslo"})]
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
    assert parser.parse(text) == ParsedToolCalls("", [FunctionCall("get_current_weather", {"location": "Tokyo"})])
    assert parser.parse("<|channel|>final<|message|>Sunny, 20 C.<|return|>").text == "Sunny, 20 C."


@pytest.mark.parametrize(
    ("name", "keeps"), [("hermes", False), ("qwen3_coder", False), ("kimi_k2", True), ("gpt-oss", True)]
)
def test_formats_whose_markers_are_special_tokens_decode_with_special_tokens_kept(name, keeps):
    tokenizer = RecordingTokenizer("plain text")
    ToolParser.get(name, tokenizer).extract_tool_calls([1, 2, 3])
    assert tokenizer.skip_special_tokens is (not keeps)
