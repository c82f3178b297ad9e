"""Tool-call parsers: turn a model turn's tokens into its text and the function calls it makes.

A parser is a `ToolParser` subclass registered by name and selected by `actor_rollout_ref.rollout.multi_turn.format`
(the base types and the registry live in parser_base.py and are imported from here):

    @ToolParser.register("my_format")
    class MyParser(ToolParser):
        def parse(self, text: str, tools=None) -> ParsedToolCalls: ...

    parser = ToolParser.get("hermes", tokenizer)    # also qwen3_coder, kimi (kimi_k2), gpt-oss (parser_formats.py)
    text, calls = await parser.extract_tool_calls(response_ids, tools=schemas)   # calls: list[FunctionCall]

A `FunctionCall` carries its arguments as the JSON text of an object (OpenAI's and verl's `arguments`;
`call.arguments_dict()` decodes them) and the model's call id where the format has one (`tool_call_id`).
`tools` (the active tools' `OpenAIFunctionToolSchema`s, optional) lets a format read values by their declared types.
`parser.forced_call_prefix(name)` is the opening of a call in the format (of tool `name`, or of any tool for None):
`hyflow serve` starts a reply with it for a named or "required" `tool_choice`; a format without one cannot be forced.

Parsers never raise on model output: a malformed call (bad JSON, no name, arguments not an object, an unclosed
tag) is skipped and counted in `ParsedToolCalls.num_malformed`, which the agent loop reports as a metric.
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING

# The other built-in formats register themselves on import; they share the base types with this module.
from hyflow.agent import parser_formats  # noqa: F401
from hyflow.agent.parser_base import FunctionCall, ParsedToolCalls, ToolParser, decode_arguments, to_function_call

if TYPE_CHECKING:
    from hyflow.agent.tools.schemas import OpenAIFunctionToolSchema

__all__ = [
    "FunctionCall",
    "HermesToolParser",
    "ParsedToolCalls",
    "ToolParser",
    "decode_arguments",
    "to_function_call",
]

logger = logging.getLogger(__name__)


@ToolParser.register("hermes")
class HermesToolParser(ToolParser):
    """Hermes / Qwen format: each call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)

    def parse(self, text: str, tools: list[OpenAIFunctionToolSchema] | None = None) -> ParsedToolCalls:
        calls: list[FunctionCall] = []
        num_malformed = 0
        for payload in self._BLOCK.findall(text):
            call = to_function_call(payload.strip())
            if call is None:
                num_malformed += 1
            else:
                calls.append(call)
        rest = self._BLOCK.sub("", text)
        if self.OPEN in rest:  # an opening tag that never closes (e.g. the turn hit the length limit)
            num_malformed += rest.count(self.OPEN)
            rest = rest[: rest.index(self.OPEN)]
        if num_malformed:
            logger.debug("hermes parser skipped %d malformed tool call(s)", num_malformed)
        return ParsedToolCalls(text=rest.strip(), calls=calls, num_malformed=num_malformed)

    def forced_call_prefix(self, name: str | None, num_previous_calls: int = 0) -> str:
        """`<tool_call>` and, for a named tool, the JSON object up to its arguments."""
        if name is None:
            return f"{self.OPEN}\n"
        return f'{self.OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '
