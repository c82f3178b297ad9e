"""Tool-call formats of current model families, registered beside `hermes` (hyflow/agent/parsers.py), under
verl's class and format names:

- `qwen3_coder` (`Qwen3XMLToolParser`; Qwen3-Coder / Qwen3.5 XML): `<tool_call><function=NAME><parameter=KEY>VALUE
  </parameter>...</function></tool_call>`. A value is read by its parameter's declared type when the tool's schema
  is given (`string` stays text, `integer` / `number` / `boolean` are converted, also as the non-null type of an
  `anyOf`, anything else is JSON or a Python literal, read by `ast.literal_eval`, never `eval`); without a schema
  it is JSON when it parses, else text. A value that does not convert stays text; a parameter cut off before its
  `>` is skipped. `hyflow serve` passes the request's `tools` (request_tool_schemas), as the agent loop passes its
  tools' schemas.
- `kimi` / `kimi_k2` (`KimiToolParser`): `<|tool_calls_section_begin|><|tool_call_begin|>ID
  <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>`. The ID (usually
  `functions.NAME:IDX`) is kept as `tool_call_id`; the name is read from it, matched against the tools' names.
- `gpt-oss` (OpenAI harmony): `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`;
  the text is the `final` channel's message.

Kimi K2's and harmony's markers are special tokens, so those parsers decode with them kept
(`keep_special_tokens`). Like every parser, they never raise on model output: a malformed call is skipped and
counted.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from typing import TYPE_CHECKING, Any

from hyflow.agent.parser_base import FunctionCall, ParsedToolCalls, ToolParser, decode_arguments

if TYPE_CHECKING:
    from hyflow.agent.tools.schemas import OpenAIFunctionToolSchema

logger = logging.getLogger(__name__)


def _guess_value(text: str) -> Any:
    """A value without a declared type: JSON when it parses (3, true, {"a": 1}), else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _typed_value(text: str, json_type: str) -> Any:
    """A parameter's text read as its declared JSON type; the text itself when it does not convert."""
    if text.lower() == "null":
        return None
    try:
        if json_type == "string":
            return text
        if json_type == "integer":
            return int(text)
        if json_type == "number":
            return int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text)
        if json_type == "boolean":
            return {"true": True, "false": False}[text.lower()]
    except (ValueError, KeyError):
        logger.debug("parameter value %r is not a %s; kept as text", text, json_type)
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)  # a Python literal such as ['a', 'b']; never evaluates code
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _parameter_types(name: str, tools: list[OpenAIFunctionToolSchema] | None) -> dict[str, str] | None:
    """{parameter: declared JSON type} of the tool `name`, or None when its schema is not given."""
    for tool in tools or []:
        if tool.function.name == name:
            types = {}
            for key, spec in tool.function.parameters.properties.items():
                kinds = spec.type if isinstance(spec.type, list) else [spec.type]
                if spec.type is None:  # {"anyOf": [{"type": "integer"}, {"type": "null"}]} (pydantic's Optional)
                    options = (spec.model_extra or {}).get("anyOf") or []
                    kinds = [option.get("type") for option in options if isinstance(option, dict)]
                kinds = [kind for kind in kinds if isinstance(kind, str) and kind != "null"]
                types[key] = "number" if "number" in kinds else str(kinds[0] if kinds else "string").lower()
            return types
    return None


@ToolParser.register("qwen3_coder")
class Qwen3XMLToolParser(ToolParser):
    """Qwen3's XML calls: one `<function=NAME>` per `<tool_call>` block, one `<parameter=KEY>` per argument."""

    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    _FUNCTION = re.compile(r"^\s*<function=(.*?)</function>\s*$", re.DOTALL)
    _PARAMETER = re.compile(r"<parameter=(.*?)</parameter>", re.DOTALL)

    def _parse_xml_function_call(
        self, function_call_str: str, tools: list[OpenAIFunctionToolSchema] | None
    ) -> FunctionCall | None:
        """One call from the text inside `<function=` ... `</function>` ("NAME><parameter=...>..."); None when the
        name is not closed by `>`."""
        name, separator, body = function_call_str.partition(">")
        name = name.strip()
        if not separator or not name:
            return None
        types = _parameter_types(name, tools)
        arguments = {}
        for match in self._PARAMETER.findall(body):
            key, separator, value = match.partition(">")
            if not separator:  # a parameter header cut off by the length limit
                continue
            value = value.removeprefix("\n").removesuffix("\n")
            if types is None:
                arguments[key] = _guess_value(value)
            else:
                arguments[key] = _typed_value(value, types[key]) if key in types else value
        return FunctionCall.of(name, arguments)

    def parse(self, text: str, tools: list[OpenAIFunctionToolSchema] | None = None) -> ParsedToolCalls:
        calls: list[FunctionCall] = []
        num_malformed = 0
        for block in self._BLOCK.findall(text):
            function = self._FUNCTION.match(block)
            call = self._parse_xml_function_call(function.group(1), tools) if function else None
            if call is None:
                num_malformed += 1
            else:
                calls.append(call)
        rest = self._BLOCK.sub("", text)
        if "<tool_call>" in rest:  # an opening tag that never closes
            num_malformed += rest.count("<tool_call>")
            rest = rest[: rest.index("<tool_call>")]
        return ParsedToolCalls(text=rest.strip(), calls=calls, num_malformed=num_malformed)

    def forced_call_prefix(self, name: str | None, num_previous_calls: int = 0) -> str:
        """`<tool_call>` and `<function=`, with the tool's name and its line end when it is given."""
        return "<tool_call>\n<function=" + ("" if name is None else f"{name}>\n")


def _tool_name(call_id: str, arguments: dict[str, Any], tools: list[OpenAIFunctionToolSchema] | None) -> str | None:
    """The tool a Kimi call id names: `functions.NAME:IDX` → NAME; an id that names no tool is matched to the one
    tool whose name it contains, else to the one tool whose required parameters the arguments fill."""
    match = re.match(r"^(?:functions\.)?([A-Za-z0-9_\-.]+?)(?::\d+)?$", call_id)
    name = match.group(1) if match else None
    names = [tool.function.name for tool in tools or []]
    if not names or name in names:
        return name
    contained = [tool for tool in names if tool.lower() in call_id.lower().replace("-", "_")]
    if len(contained) == 1:
        return contained[0]
    filled = [
        tool.function.name
        for tool in tools
        if tool.function.parameters.required and set(tool.function.parameters.required) <= set(arguments)
    ]
    return filled[0] if len(filled) == 1 else name


@ToolParser.register("kimi")
@ToolParser.register("kimi_k2")
class KimiToolParser(ToolParser):
    """Kimi K2's call section: call ids (`functions.NAME:IDX`) followed by JSON arguments."""

    keep_special_tokens = True
    SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    END_OF_TURN = "<|im_end|>"
    _CALL = re.compile(
        r"<\|tool_call_begin\|>\s*(\S+?)\s*<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.DOTALL
    )

    def parse(self, text: str, tools: list[OpenAIFunctionToolSchema] | None = None) -> ParsedToolCalls:
        text = text.strip().removesuffix(self.END_OF_TURN)
        if self.SECTION_BEGIN not in text:
            return ParsedToolCalls(text=text.strip(), calls=[])
        before, _, section = text.partition(self.SECTION_BEGIN)
        section, closed, after = section.partition(self.SECTION_END)
        calls: list[FunctionCall] = []
        num_malformed = 0 if closed else 1
        found = self._CALL.findall(section)
        for call_id, payload in found:
            arguments = decode_arguments(payload.strip())
            name = _tool_name(call_id, arguments, tools) if arguments is not None else None
            if name is None:
                num_malformed += 1
            else:
                calls.append(FunctionCall.of(name, arguments, tool_call_id=call_id))
        num_malformed += section.count("<|tool_call_begin|>") - len(found)  # calls cut off before their end
        return ParsedToolCalls(text=(before + after).strip(), calls=calls, num_malformed=num_malformed)

    def forced_call_prefix(self, name: str | None, num_previous_calls: int = 0) -> str:
        """The section's and the call's openings, then the call id: `functions.` and, for a named tool,
        `NAME:IDX` (IDX counts the conversation's calls, as Kimi K2's ids do) and the arguments' marker."""
        opening = f"{self.SECTION_BEGIN}<|tool_call_begin|>functions."
        return opening if name is None else f"{opening}{name}:{num_previous_calls}<|tool_call_argument_begin|>"


@ToolParser.register("gpt-oss")
class GptOssToolParser(ToolParser):
    """OpenAI harmony messages: calls on the commentary channel addressed `to=functions.NAME`, text on `final`; a
    NAME may hold dots (`to=functions.web.search` calls `web.search`)."""

    keep_special_tokens = True
    _CALL = re.compile(
        r"to=functions\.([A-Za-z0-9_\-.]+)[^<]*(?:<\|constrain\|>\s*\w+\s*)?<\|message\|>(.*?)<\|call\|>", re.DOTALL
    )
    _FINAL = re.compile(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|return\|>|<\|end\|>|$)", re.DOTALL)

    def parse(self, text: str, tools: list[OpenAIFunctionToolSchema] | None = None) -> ParsedToolCalls:
        calls: list[FunctionCall] = []
        num_malformed = 0
        for name, payload in self._CALL.findall(text):
            arguments = decode_arguments(payload.strip())
            if arguments is None:
                num_malformed += 1
            else:
                calls.append(FunctionCall.of(name, arguments))
        final = self._FINAL.findall(text)
        if final:
            content = "".join(final)
        elif "<|" in text:  # harmony framing without a final message: nothing for the user yet
            content = ""
        else:
            content = text
        return ParsedToolCalls(text=content.strip(), calls=calls, num_malformed=num_malformed)

    def forced_call_prefix(self, name: str | None, num_previous_calls: int = 0) -> str:
        """A commentary-channel message addressed `to=functions.`, with the tool's name and the JSON constraint
        when it is given (after the generation prompt's `<|start|>assistant`; the analysis channel is skipped)."""
        opening = "<|channel|>commentary to=functions."
        return opening if name is None else f"{opening}{name} <|constrain|>json<|message|>"
