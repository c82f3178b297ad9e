"""Tool-call formats of current model families, registered beside `hermes` (hyflow/agent/parsers.py):

- `qwen3_coder` (Qwen3-Coder / Qwen3 XML): `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function>
  </tool_call>`; a value is read as JSON when it parses (numbers, booleans, objects), else kept as text.
- `kimi_k2`: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}
  <|tool_call_end|>...<|tool_calls_section_end|>`.
- `gpt-oss` (OpenAI harmony): `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`;
  the text is the `final` channel's message.

Kimi K2's and harmony's markers are special tokens, so those parsers decode with them kept
(`keep_special_tokens`). Like every parser, they never raise on model output: a malformed call is skipped and
counted.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hyflow.agent.parsers import FunctionCall, ParsedToolCalls, ToolParser, to_function_call


def _parameter_value(raw: str) -> Any:
    """A parameter's text as JSON when it is valid JSON (3, true, {"a": 1}), else the text itself."""
    text = raw.strip("\n")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@ToolParser.register("qwen3_coder")
class Qwen3CoderToolParser(ToolParser):
    """Qwen3's XML calls: one `<function=NAME>` per `<tool_call>` block, one `<parameter=KEY>` per argument."""

    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    _FUNCTION = re.compile(r"^\s*<function=([^>\s]+)>(.*?)</function>\s*$", re.DOTALL)
    _PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)

    def parse(self, text: str) -> ParsedToolCalls:
        calls: list[FunctionCall] = []
        num_malformed = 0
        for block in self._BLOCK.findall(text):
            function = self._FUNCTION.match(block)
            if function is None:
                num_malformed += 1
                continue
            name, body = function.groups()
            arguments = {key: _parameter_value(value) for key, value in self._PARAMETER.findall(body)}
            calls.append(FunctionCall(name=name, arguments=arguments))
        rest = self._BLOCK.sub("", text)
        if "<tool_call>" in rest:  # an opening tag that never closes
            num_malformed += rest.count("<tool_call>")
            rest = rest[: rest.index("<tool_call>")]
        return ParsedToolCalls(text=rest.strip(), calls=calls, num_malformed=num_malformed)


@ToolParser.register("kimi_k2")
class KimiK2ToolParser(ToolParser):
    """Kimi K2's call section: `functions.NAME:IDX` ids followed by JSON arguments."""

    keep_special_tokens = True
    SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    _CALL = re.compile(
        r"<\|tool_call_begin\|>\s*(\S+?)\s*<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.DOTALL
    )
    _CALL_ID = re.compile(r"^(?:functions\.)?([A-Za-z0-9_\-.]+?)(?::\d+)?$")

    def parse(self, text: str) -> ParsedToolCalls:
        if self.SECTION_BEGIN not in text:
            return ParsedToolCalls(text=text.strip(), calls=[])
        before, _, section = text.partition(self.SECTION_BEGIN)
        section, closed, after = section.partition(self.SECTION_END)
        calls: list[FunctionCall] = []
        num_malformed = 0 if closed else 1
        found = self._CALL.findall(section)
        for call_id, payload in found:
            name = self._CALL_ID.match(call_id)
            call = to_function_call(json.dumps({"name": name.group(1), "arguments": payload.strip()})) if name else None
            if call is None:
                num_malformed += 1
            else:
                calls.append(call)
        num_malformed += section.count("<|tool_call_begin|>") - len(found)  # calls cut off before their end
        return ParsedToolCalls(text=(before + after).strip(), calls=calls, num_malformed=num_malformed)


@ToolParser.register("gpt-oss")
class GptOssToolParser(ToolParser):
    """OpenAI harmony messages: calls on the commentary channel addressed `to=functions.NAME`, text on `final`."""

    keep_special_tokens = True
    _CALL = re.compile(
        r"to=functions\.([A-Za-z0-9_\-]+)[^<]*(?:<\|constrain\|>\s*\w+\s*)?<\|message\|>(.*?)<\|call\|>", re.DOTALL
    )
    _FINAL = re.compile(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|return\|>|<\|end\|>|$)", re.DOTALL)

    def parse(self, text: str) -> ParsedToolCalls:
        calls: list[FunctionCall] = []
        num_malformed = 0
        for name, payload in self._CALL.findall(text):
            call = to_function_call(json.dumps({"name": name, "arguments": payload.strip()}))
            if call is None:
                num_malformed += 1
            else:
                calls.append(call)
        final = self._FINAL.findall(text)
        if final:
            content = "".join(final)
        elif "<|" in text:  # harmony framing without a final message: nothing for the user yet
            content = ""
        else:
            content = text
        return ParsedToolCalls(text=content.strip(), calls=calls, num_malformed=num_malformed)
