"""`RolloutEndpoint`: one `openai_agent` rollout's chat endpoint, the half that generates and records.

It generates each completion on the loop's server and records the trajectory in an `AgentData`, one growing
conversation (rules in hyflow/agent/openai_agent.py); `HistoryRewritten` is its refusal of a request whose history
is not the conversation so far. The HTTP half (FastAPI app, in-process client) is hyflow/agent/openai_endpoint.py,
which imports this module; `hyflow.agent.openai_agent` re-exports both names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hyflow.agent.chat import encode_prompt
from hyflow.agent.loop import AgentData, AgentLoopBase
from hyflow.agent.tools.schemas import request_tool_schemas
from hyflow.engine.config import SamplingParams


class HistoryRewritten(ValueError):
    """The agent sent a history that is not the conversation so far."""


def without_reasoning(content: str) -> str:
    """A reply's text as a client of a thinking model sends it back: what follows its last `</think>`, stripped."""
    return content.split("</think>")[-1].strip() if "</think>" in content else content


def same_message(sent: dict[str, Any], recorded: dict[str, Any]) -> bool:
    """Whether `sent` is the recorded message, or the recorded assistant reply without its `<think>` block (normal
    usage with thinking templates: the trajectory keeps the sampled tokens, the sent text is never re-encoded)."""
    if sent == recorded:
        return True
    content = recorded.get("content")
    if recorded.get("role") != "assistant" or not isinstance(content, str) or "</think>" not in content:
        return False
    sent_content = sent.get("content")
    sent_content = sent_content.strip() if isinstance(sent_content, str) else sent_content
    return {**sent, "content": sent_content} == {**recorded, "content": without_reasoning(content)}


class RolloutEndpoint:
    """One rollout's chat endpoint: generates on the loop's server and records the trajectory in `data`."""

    def __init__(self, loop: AgentLoopBase, sampling_params: SamplingParams, request_id: str) -> None:
        self.loop, self.sampling_params = loop, sampling_params
        self.data = AgentData(request_id=request_id, messages=[])
        self.tools: list[dict[str, Any]] | None = None
        self.error: HistoryRewritten | None = None

    def _extend_context(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        """The prompt (first request), or the checked delta of the messages added since the last reply."""
        data, history = self.data, self.data.messages
        if not history:
            template_kwargs = self.loop.context.chat_template_kwargs
            data.prompt_ids, self.tools = encode_prompt(self.loop.tokenizer, messages, tools, template_kwargs), tools
            return
        for index, (sent, recorded) in enumerate(zip(messages, history)):
            if not same_message(sent, recorded):
                raise HistoryRewritten(
                    f"messages[{index}] is not the conversation so far (sent {sent!r:.120}, recorded "
                    f"{recorded!r:.120}); openai_agent trains one growing conversation per rollout: send the earlier "
                    "messages and each reply as returned (its <think> block may be left out), and only append"
                )
        if len(messages) <= len(history) or tools != self.tools:
            what = "changes the tools" if tools != self.tools else "adds no message after the last reply"
            raise HistoryRewritten(f"the request {what}; openai_agent needs the same tools and new messages per turn")
        new = messages[len(history) :]
        data.append_context_tokens(self.loop.context.message_delta.encode(new, data.last_turn_ended_with_eos))
        data.user_turns += 1  # what the agent added: tool results, user messages (mask 0)

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict] | None, max_tokens: int | None):
        """The reply to one chat request: (assistant message in the template's form, finish_reason, prompt
        tokens, completion tokens)."""
        try:
            self._extend_context(messages, tools)
        except HistoryRewritten as error:
            self.error = error
            raise
        data, tokenizer = self.data, self.loop.tokenizer
        messages = [*data.messages, *messages[len(data.messages) :]]  # earlier replies as recorded, with reasoning
        budget = self.loop.response_length - len(data.response_ids)
        if max_tokens is not None:
            budget = min(budget, max_tokens)
        if budget <= 0:
            data.finish_reason = "length"
            data.messages = [*messages, {"role": "assistant", "content": ""}]
            return data.messages[-1], "length", len(data.prompt_ids) + len(data.response_ids), 0
        seed = self.sampling_params.seed
        if seed is not None:  # a fresh, reproducible seed per turn, as ToolAgentLoop
            seed = (seed + 7919 * data.assistant_turns) & 0xFFFFFFFF
        params = dataclasses.replace(self.sampling_params, max_tokens=budget, seed=seed)
        context = data.prompt_ids + data.response_ids
        output = await self.loop.server.generate(data.request_id, context, params)
        data.append_model_tokens(output.token_ids, output.log_probs, output.policy_versions)
        data.assistant_turns += 1
        ended_with_eos = bool(output.token_ids) and output.token_ids[-1] == tokenizer.eos_token_id
        data.last_turn_ended_with_eos = ended_with_eos
        content = tokenizer.decode(output.token_ids[:-1] if ended_with_eos else output.token_ids)
        message = self._assistant_message(content, tools)
        data.messages = [*messages, message]
        data.finish_reason = output.finish_reason
        reason = "tool_calls" if message.get("tool_calls") else output.finish_reason
        return message, reason, len(context), len(output.token_ids)

    def _assistant_message(self, content: str, tools: list[dict] | None) -> dict[str, Any]:
        """The reply as the template renders it back: its text, and its calls when the request had tools."""
        if not tools:
            return {"role": "assistant", "content": content}
        parsed = self.loop.context.tool_parser.parse(content, request_tool_schemas(tools))  # typed by the schemas
        self.data.metrics.num_malformed_tool_calls += parsed.num_malformed
        if not parsed.calls:
            return {"role": "assistant", "content": content}
        calls = [
            {
                "id": call.tool_call_id or f"call_{self.data.assistant_turns}_{i}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_dict()},
            }
            for i, call in enumerate(parsed.calls)
        ]
        self.data.metrics.num_tool_calls += len(calls)
        return {"role": "assistant", "content": parsed.text, "tool_calls": calls}
