"""OpenAI response bodies from the engine's outputs: choices, log-probs, tool calls, usage, and stream chunks.

finish_reason: the engine's "stop" (EOS, a stop token or string) and "length" pass through; a chat reply whose
text holds tool calls (read by the server's tool parser) ends with "tool_calls".
Log-probs are the engine's: of the distribution sampled from, with its `top_log_probs` most likely alternatives.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hyflow.agent.parsers import ToolParser
from hyflow.agent.tools.schemas import OpenAIFunctionToolSchema
from hyflow.engine.sequence import CompletionOutput


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


@dataclass
class Envelope:
    """What every response and chunk of one request shares."""

    kind: str  # "text_completion" or "chat.completion"
    model: str
    id: str = field(default_factory=lambda: new_id("cmpl"))
    created: int = field(default_factory=lambda: int(time.time()))

    def body(self, choices: list[dict[str, Any]], usage: dict[str, int] | None, chunk: bool = False) -> dict[str, Any]:
        kind = f"{self.kind}.chunk" if chunk and self.kind == "chat.completion" else self.kind
        body = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None or not chunk:
            body["usage"] = usage
        return body


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    total = prompt_tokens + completion_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}


TokenText = Callable[[int], str]  # a token id's own text (`ServingState.token_text`, text.TokenTexts)


def completion_log_probs(
    token_text: TokenText, out: CompletionOutput, start: int, end: int, text_offset: int = 0
) -> dict[str, Any]:
    """The legacy completions `logprobs` object for tokens start..end of a sample."""
    tokens = [token_text(token) for token in out.token_ids[start:end]]
    offsets, position = [], text_offset
    for token in tokens:
        offsets.append(position)
        position += len(token)
    top = None
    if out.top_log_probs is not None:
        top = [{token_text(t): lp for t, lp in alts.items()} for alts in out.top_log_probs[start:end]]
    return {"tokens": tokens, "token_logprobs": out.log_probs[start:end], "top_logprobs": top, "text_offset": offsets}


def chat_log_probs(token_text: TokenText, out: CompletionOutput, start: int, end: int) -> dict[str, Any]:
    """The chat `logprobs` object ({"content": [...]}) for tokens start..end of a sample."""

    def entry(token: int, log_prob: float) -> dict[str, Any]:
        text = token_text(token)
        return {"token": text, "logprob": log_prob, "bytes": list(text.encode())}

    content = []
    for k in range(start, end):
        item = entry(out.token_ids[k], out.log_probs[k])
        alternatives = out.top_log_probs[k] if out.top_log_probs is not None else {}
        item["top_logprobs"] = [entry(t, lp) for t, lp in alternatives.items()]
        content.append(item)
    return {"content": content}


@dataclass
class ToolCalls:
    """The calls a chat reply holds, as OpenAI's `tool_calls`, and the text outside them."""

    content: str | None
    calls: list[dict[str, Any]]


def read_tool_calls(
    parser: ToolParser, text: str, parallel: bool, tools: list[OpenAIFunctionToolSchema] | None = None
) -> ToolCalls:
    """Tool calls in `text` by the server's parser (the agent loop's registry), which reads the argument values by
    the request's `tools` (their declared parameter types); only the first call unless `parallel`."""
    parsed = parser.parse(text, tools)
    calls = [
        {
            "id": new_id("call"),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in parsed.calls
    ]
    return ToolCalls(parsed.text or None, calls if parallel else calls[:1])


def chat_message(text: str, tools: ToolCalls | None) -> tuple[dict[str, Any], str | None]:
    """The assistant message of a reply, and "tool_calls" when it holds calls (None: the engine's reason stands)."""
    if tools is not None and tools.calls:
        return {"role": "assistant", "content": tools.content, "tool_calls": tools.calls}, "tool_calls"
    return {"role": "assistant", "content": text}, None


def token_extras(out: CompletionOutput) -> dict[str, Any]:
    """hyflow's RL extras of a choice (with return_token_ids): the sampled ids and each one's log-prob."""
    return {"token_ids": out.token_ids, "token_log_probs": out.log_probs}
