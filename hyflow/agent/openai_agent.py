"""The `openai_agent` loop: an agent program written with the official `openai` client, trained unchanged.

    @openai_agent("calculator_agent")             # or: CalculatorAgent = openai_agent_loop(run), for the YAML
    async def run(client: openai.AsyncOpenAI, sample: dict) -> float | None:
        messages = list(sample["raw_prompt"])
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        ...                                   # any number of calls and turns; tools run in the agent's own code
        return reward                         # or None

Each rollout gets its own endpoint: an in-process OpenAI chat API (httpx's ASGI transport, no socket), whose
completions run on the loop's generation server (the policy being trained) and are recorded. The trajectory is one
growing conversation, assembled as `ToolAgentLoop` assembles it: the first request's prompt, then per turn the
model's tokens (response_mask 1, their sampling log-probs) and the messages the agent added since (mask 0, encoded
as the chat template's delta, chat.MessageDelta), never a re-tokenization of earlier turns. So the assembled
sequence re-scores to the log-probs its tokens were sampled with.

Rules of the endpoint: sampling is the rollout's (`actor_rollout_ref.rollout.*`), with the agent's `max_tokens`
as a cap and the response budget (`response_length`) over the whole episode; the agent's other sampling keys are
not used (on-policy RL samples with the trainer's settings). A request whose history is not the previous request's
messages plus the reply as returned (the agent rewrote or dropped messages) is refused with a 400 naming the
message, and the episode fails with that error: hyflow trains one conversation per rollout and does not split a
trajectory into segments. The function's reward travels with the trajectory as the non-tensor field
`agent_reward` (None when it returned None). The reward managers take it as the row's score and skip the scoring
function for that row; a None leaves the row to the configured scorer, which scores the final text as for any
rollout (precedence in hyflow/reward/managers/base.py).
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
from collections.abc import Awaitable, Callable
from typing import Any

from hyflow import fields as F
from hyflow.agent.chat import encode_prompt
from hyflow.agent.loop import AgentData, AgentLoopBase, AgentLoopOutput, register_agent_loop
from hyflow.agent.tools.schemas import request_tool_schemas
from hyflow.engine.config import SamplingParams

logger = logging.getLogger(__name__)

AgentFunction = Callable[[Any, dict[str, Any]], Awaitable[float | None]]


class HistoryRewritten(ValueError):
    """The agent sent a history that is not the conversation so far."""


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
            data.prompt_ids, self.tools = encode_prompt(self.loop.tokenizer, messages, tools), tools
            return
        for index, (sent, recorded) in enumerate(zip(messages, history)):
            if sent != recorded:
                raise HistoryRewritten(
                    f"messages[{index}] is not the conversation so far (sent {sent!r:.120}, recorded "
                    f"{recorded!r:.120}); openai_agent trains one growing conversation per rollout: send the earlier "
                    "messages and each reply as returned, and only append"
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


class OpenAIAgentLoop(AgentLoopBase):
    """Runs `agent(client, sample)` against a recording endpoint of its own; see the module docstring."""

    agent: AgentFunction

    async def run(self, sampling_params: SamplingParams, **kwargs: Any) -> AgentLoopOutput:
        from hyflow.agent.openai_endpoint import endpoint_client

        endpoint = RolloutEndpoint(self, sampling_params, kwargs["request_id"])
        async with endpoint_client(endpoint) as client:
            try:
                reward = await type(self).agent(client, kwargs)
            except Exception:
                if endpoint.error is not None:  # the agent's own error is the 400 of a rewritten history
                    raise endpoint.error from None
                raise
        if endpoint.error is not None:
            raise endpoint.error
        if not endpoint.data.assistant_turns:
            raise ValueError(f"the openai_agent function {type(self).agent.__name__} made no chat completion request")
        output = endpoint.data.to_output(self.response_length)
        if reward is not None:
            output.extra_fields[F.AGENT_REWARD] = checked_reward(reward, type(self).agent)
        return output


def checked_reward(reward: Any, function: AgentFunction) -> float:
    """The function's reward as a float; anything but a real number (or a 0-d array of one) is a TypeError."""
    if isinstance(reward, numbers.Real) or (getattr(reward, "ndim", None) == 0 and hasattr(reward, "item")):
        return float(reward)
    raise TypeError(
        f"the openai_agent function {function.__name__} returned {reward!r:.80} ({type(reward).__name__}); it returns "
        "a number (the episode's reward) or None (the reward manager scores the final text)."
    )


def openai_agent_loop(function: AgentFunction) -> type[OpenAIAgentLoop]:
    """The agent loop class that runs `function`, for `agent_loop_config_path`: with `MyAgent =
    openai_agent_loop(run)` in my_pkg/agents.py, the YAML lists `agent_loops: [{name: my_agent, _target_:
    my_pkg.agents.MyAgent}]`."""
    name = f"{function.__name__.title().replace('_', '')}AgentLoop"
    return type(name, (OpenAIAgentLoop,), {"agent": staticmethod(function), "__module__": function.__module__})


def openai_agent(name: str) -> Callable[[AgentFunction], AgentFunction]:
    """Decorator: register an `async def run(client, sample) -> reward | None` as the agent loop `name` (for
    samples whose `agent_name` is `name`, once the module is imported)."""

    def decorator(function: AgentFunction) -> AgentFunction:
        register_agent_loop(name)(openai_agent_loop(function))
        return function

    return decorator
