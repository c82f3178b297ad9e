"""Agent-loop building blocks: the base class and its registry, the per-episode record, the typed output.

A loop turns one sample into one trajectory. `AgentLoopManager` builds one loop object per sample and awaits

    output: AgentLoopOutput = await loop.run(sampling_params, **row)

where `row` holds the sample's non-tensor fields (`raw_prompt`, `tools_kwargs`, `extra_info`, `interaction_kwargs`,
...) plus `request_id`, the conversation id that keeps every turn on the same generation server. New loops register
by name and are picked per sample through its `agent_name`:

    @register_agent_loop("my_agent")
    class MyAgentLoop(AgentLoopBase):
        async def run(self, sampling_params, **kwargs) -> AgentLoopOutput: ...

Response layout (R = response tokens): `response_ids[i]` is a model token when `response_mask[i] == 1` (with its
sampling log-prob in `response_log_probs[i]`), a tool / user token when 0 (log-prob 0.0).

Vision-language models: `AgentData.image_data` / `video_data` hold the episode's images and videos (the prompt's,
then those tools returned) and `multi_modal_inputs` their processor outputs, in the order of their pad tokens in
prompt_ids + response_ids; the output carries `multi_modal_inputs` to training (see `hyflow.agent.vision`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from hyflow.engine.config import SamplingParams

if TYPE_CHECKING:
    from hyflow.agent.chat import MessageDelta
    from hyflow.agent.interactions.base import BaseInteraction
    from hyflow.agent.parsers import FunctionCall, ToolParser
    from hyflow.agent.server import AsyncLLMServer
    from hyflow.agent.tools.registry import Tool
    from hyflow.config.actor_rollout_ref import MultiTurnConfig

# Why an episode ended (the `finish_reason` field): the model stopped on its own (or the interaction ended it),
# the response length ran out, a turn limit was hit, or generation was aborted.
EpisodeEnd = Literal["stop", "length", "max_turns", "abort"]


@dataclass
class AgentLoopMetrics:
    """Per-episode counters and timings, averaged over the batch into `meta_info["metrics"]`."""

    generate_seconds: float = 0.0
    tool_seconds: float = 0.0
    num_tool_calls: int = 0
    num_failed_tool_calls: int = 0  # raised, timed out, unknown tool, or missing arguments
    num_malformed_tool_calls: int = 0  # skipped by the parser
    num_dropped_tool_calls: int = 0  # beyond max_parallel_calls in one turn
    # tool hooks that failed, "<hook>/<kind>" -> count (hook: create, execute, calc_reward, release; kind: timeout,
    # raised); reported per key that occurred in the batch as agent/tool_hook_failures/<hook>/<kind>/mean
    tool_hook_failures: dict[str, int] = field(default_factory=dict)
    num_abandoned_tool_threads: int = 0  # timed-out hooks whose thread did not finish when cancelled (left behind)

    def count_hook_failure(self, hook: str, kind: str) -> None:
        key = f"{hook}/{kind}"
        self.tool_hook_failures[key] = self.tool_hook_failures.get(key, 0) + 1


@dataclass
class AgentLoopOutput:
    """One trajectory. The three response lists have the same length (at most `response_length`)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_log_probs: list[float]
    num_turns: int
    finish_reason: EpisodeEnd
    metrics: AgentLoopMetrics = field(default_factory=AgentLoopMetrics)
    # Reward extras: "turn_scores" (one per interaction turn), "tool_rewards" (one per executed tool call),
    # "tool_scores" (tool name -> its calc_reward for the episode, tool_agent only).
    extra_fields: dict[str, Any] = field(default_factory=dict)
    # per response token, the policy version that sampled it (-1: a tool / user token, or not tracked)
    response_policy_versions: list[int] | None = None
    # Processor outputs of every image / video of prompt + response (vision-language models; None: text only).
    multi_modal_inputs: dict[str, Any] | None = None
    # the engine's routing record of prompt + response, from the last turn's call (routing replay R3; None: none)
    routed_experts: Any = None

    def __post_init__(self) -> None:
        lengths = {len(self.response_ids), len(self.response_mask), len(self.response_log_probs)}
        assert len(lengths) == 1, f"response lists out of step: {lengths}"


@dataclass
class AgentData:
    """Everything one episode of a multi-turn loop accumulates, passed from state to state."""

    request_id: str
    messages: list[dict[str, Any]]
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_log_probs: list[float] = field(default_factory=list)
    response_policy_versions: list[int] = field(default_factory=list)  # -1 for context tokens
    tools_kwargs: dict[str, Any] = field(default_factory=dict)
    tool_calls: list[FunctionCall] = field(default_factory=list)  # parsed from the last model turn
    tool_instances: dict[str, str] = field(default_factory=dict)  # tool name -> instance id, created lazily
    broken_tools: dict[str, str] = field(default_factory=dict)  # tool name -> why it is out of service this episode
    interaction: BaseInteraction | None = None
    interaction_id: str | None = None
    turn_scores: list[float] = field(default_factory=list)
    tool_rewards: list[float] = field(default_factory=list)
    user_turns: int = 0
    assistant_turns: int = 0
    tool_turns: int = 0
    last_turn_ended_with_eos: bool = False
    finish_reason: EpisodeEnd = "stop"
    metrics: AgentLoopMetrics = field(default_factory=AgentLoopMetrics)
    extra_fields: dict[str, Any] = field(default_factory=dict)
    image_data: list[Any] = field(default_factory=list)  # PIL images, in the order of their pads
    video_data: list[Any] = field(default_factory=list)  # videos (hyflow.data.video.Video), likewise
    multi_modal_inputs: dict[str, Any] = field(default_factory=dict)  # their processor outputs
    routed_experts: Any = None  # the last model turn's routing record (it covers every earlier token)

    def add_images(self, images: list[Any], inputs: dict[str, Any], videos: list[Any] | None = None) -> None:
        """Images (and videos) whose pad tokens were just appended: kept, and their processor outputs appended."""
        from hyflow.agent.vision import merge_inputs

        self.image_data += images
        self.video_data += videos or []
        self.multi_modal_inputs = merge_inputs(self.multi_modal_inputs, inputs)

    def append_model_tokens(
        self,
        token_ids: list[int],
        log_probs: list[float],
        policy_versions: list[int] | None = None,
        routed_experts: Any = None,
    ) -> None:
        """Tokens the policy sampled: trained on (mask 1), with the log-probs they were sampled with and the
        policy version of each (the engine's; None: not tracked, recorded as -1). `routed_experts`: the engine's
        routing record of this call's prompt and tokens; the prompt is the whole episode so far (tool and user
        tokens included, which the engine prefilled), so the last call's record covers every earlier token."""
        assert len(token_ids) == len(log_probs), "one log-prob per generated token"
        if routed_experts is not None:
            self.routed_experts = routed_experts
        self.response_ids += token_ids
        self.response_mask += [1] * len(token_ids)
        self.response_log_probs += log_probs
        self.response_policy_versions += [-1] * len(token_ids) if policy_versions is None else policy_versions

    def append_context_tokens(self, token_ids: list[int]) -> None:
        """Tool / user tokens: part of the context, never trained on (mask 0, log-prob 0)."""
        self.response_ids += token_ids
        self.response_mask += [0] * len(token_ids)
        self.response_log_probs += [0.0] * len(token_ids)
        self.response_policy_versions += [-1] * len(token_ids)

    def to_output(self, response_length: int) -> AgentLoopOutput:
        """The trajectory, cut to `response_length` tokens (mask and log-probs cut with it)."""
        return AgentLoopOutput(
            prompt_ids=list(self.prompt_ids),
            response_ids=self.response_ids[:response_length],
            response_mask=self.response_mask[:response_length],
            response_log_probs=self.response_log_probs[:response_length],
            response_policy_versions=self.response_policy_versions[:response_length],
            num_turns=1 + self.assistant_turns + self.tool_turns + self.user_turns,
            finish_reason=self.finish_reason,
            metrics=self.metrics,
            extra_fields={
                "turn_scores": list(self.turn_scores),
                "tool_rewards": list(self.tool_rewards),
                **self.extra_fields,
            },
            multi_modal_inputs=dict(self.multi_modal_inputs) or None,
            routed_experts=self.routed_experts,
        )


@dataclass
class AgentLoopContext:
    """What every loop of one manager shares: the server, the tokenizer, the limits, the tools and users."""

    server: AsyncLLMServer
    tokenizer: Any
    response_length: int
    multi_turn: MultiTurnConfig
    tool_parser: ToolParser
    message_delta: MessageDelta
    tools: dict[str, Tool] = field(default_factory=dict)
    interactions: dict[str, BaseInteraction] = field(default_factory=dict)
    processor: Any = None  # a vision-language model's processor (None: text only)
    # the chat template's own variables for every prompt (data.apply_chat_template_kwargs, e.g. enable_thinking)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


class AgentLoopBase(ABC):
    """One episode's driver. Subclasses implement `run`; the shared context arrives through the constructor."""

    def __init__(self, context: AgentLoopContext) -> None:
        self.context = context
        self.server = context.server
        self.tokenizer = context.tokenizer
        self.response_length = context.response_length

    @abstractmethod
    async def run(self, sampling_params: SamplingParams, **kwargs: Any) -> AgentLoopOutput:
        """Run the episode for one sample (`kwargs`: its non-tensor fields and `request_id`)."""


_AGENT_LOOPS: dict[str, type[AgentLoopBase]] = {}


def register_agent_loop(name: str) -> Callable[[type[AgentLoopBase]], type[AgentLoopBase]]:
    """Class decorator: make an agent loop available as `agent_name=<name>`."""

    def decorator(cls: type[AgentLoopBase]) -> type[AgentLoopBase]:
        existing = _AGENT_LOOPS.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"agent loop {name!r} is already registered by {existing.__qualname__}; pick another name")
        _AGENT_LOOPS[name] = cls
        return cls

    return decorator


def get_agent_loop_class(name: str) -> type[AgentLoopBase]:
    """The loop registered as `name`; a ValueError lists the registered names otherwise."""
    if name not in _AGENT_LOOPS:
        raise ValueError(
            f"agent_name={name!r} is not a registered agent loop; use one of {sorted(_AGENT_LOOPS)} or register "
            f"yours with @register_agent_loop({name!r}) (or list it in rollout.agent.agent_loop_config_path)."
        )
    return _AGENT_LOOPS[name]


def registered_agent_loops() -> list[str]:
    return sorted(_AGENT_LOOPS)
