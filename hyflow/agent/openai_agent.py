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
trajectory into segments. A reply sent back without its `<think>...</think>` block (what clients of thinking models
do) is the reply as returned: the trajectory keeps the tokens that were sampled, reasoning included.
The function's reward travels with the trajectory as the non-tensor field `agent_reward` (None when it returned
None). The reward managers take it as the row's score and skip the scoring function for that row; a None leaves
the row to the configured scorer, which scores the final text as for any rollout (precedence in
hyflow/reward/managers/base.py).
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Awaitable, Callable
from typing import Any

from hyflow import fields as F
from hyflow.agent.loop import AgentLoopBase, AgentLoopOutput, register_agent_loop
from hyflow.agent.rollout_endpoint import HistoryRewritten, RolloutEndpoint
from hyflow.engine.config import SamplingParams

__all__ = [
    "HistoryRewritten",
    "OpenAIAgentLoop",
    "RolloutEndpoint",
    "checked_reward",
    "openai_agent",
    "openai_agent_loop",
]

logger = logging.getLogger(__name__)

AgentFunction = Callable[[Any, dict[str, Any]], Awaitable[float | None]]


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
