"""The generation interface agent loops talk to, the adapter from hyflow's engine, and sticky routing.

An agent loop needs one call: generate tokens for a prompt, with the log-prob of each sampled token.

    class AsyncLLMServer(Protocol):
        async def generate(self, request_id, prompt_ids, sampling_params, **vision) -> TokenOutput

`vision` is empty for text; for a vision-language model it is `multi_modal_inputs=` the processor outputs
(pixel_values, image_grid_thw, ...) of the images whose expanded pad tokens `prompt_ids` holds, passed only when
there are any (so text-only servers need not accept it). The rollout's `generate` takes them: `rollout.name=hf`
runs them through `transformers.generate`.

`LocalEngineServer` puts hyflow's engine behind it (`AsyncLLMEngine`, or the rollout worker's `EngineRollout`), in
this process (`trainer.backend=local`). `WorkerServer` reaches a rollout worker in another process (a Ray actor,
`trainer.backend=ray`) through its async `generate_request` method: Ray runs concurrent calls of an async actor
method concurrently on the worker's event loop, so all conversations routed to a worker share its engine's
continuous batching; a turn that does not return within `timeout_s` raises `WorkerTimeoutError` naming the
worker's rank, node and method (the trainer passes `trainer.worker_call_timeout_s`). `ServerRouter` spreads
conversations over several servers (one per rollout worker): the first turn of a conversation goes to the server
with the fewest active conversations, and every later turn to the same one, so its prefix stays in that server's
KV cache.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from hyflow.controller.errors import WorkerTimeoutError
from hyflow.engine.config import SamplingParams

if TYPE_CHECKING:
    from hyflow.engine.async_engine import AsyncLLMEngine
    from hyflow.rollout.worker_rollout import EngineRollout

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class TokenOutput:
    """One generation: the sampled token ids, the log-prob of each, and why it stopped."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: FinishReason
    policy_versions: list[int] | None = None  # per token, the engine's weights version; None: not tracked
    # the engine's routing record of prompt + tokens (record_routing, hyflow/engine/routing_cache.py); None: none
    routed_experts: Any = None


class AsyncLLMServer(Protocol):
    """Anything that generates tokens for agent loops. `request_id` names the conversation (stable over turns)."""

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams, **vision: Any
    ) -> TokenOutput:
        """Generate a continuation of `prompt_ids` (`vision`: `multi_modal_inputs=...`, see the module docstring)."""
        ...


def token_output(output: Any) -> TokenOutput:
    """A `TokenOutput` from the engine's `RequestOutput` (first completion) or a `CompletionOutput`."""
    completion = output.outputs[0] if hasattr(output, "outputs") else output
    return TokenOutput(
        token_ids=list(completion.token_ids),
        log_probs=[float(x) for x in completion.log_probs],
        finish_reason=completion.finish_reason or "abort",
        policy_versions=None if completion.policy_versions is None else list(completion.policy_versions),
        routed_experts=getattr(completion, "routed_experts", None),
    )


class LocalEngineServer:
    """hyflow's engine as an `AsyncLLMServer`: wraps `AsyncLLMEngine` or the worker's `EngineRollout` (anything
    with `async generate(prompt_ids, params, request_id)` returning a `RequestOutput` or a `CompletionOutput`).
    Each turn gets its own engine request id, `<conversation>/<n>`."""

    def __init__(self, engine: AsyncLLMEngine | EngineRollout) -> None:
        self.engine = engine
        self._turns = itertools.count()

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams, **vision: Any
    ) -> TokenOutput:
        turn_id = f"{request_id}/{next(self._turns)}"
        return token_output(await self.engine.generate(prompt_ids, sampling_params, request_id=turn_id, **vision))


class WorkerServer:
    """A rollout worker in another process as an `AsyncLLMServer`: each turn is one call of the worker's async
    method (`ActorRolloutRefWorker.generate_request`; `<role>__generate_request` on a colocated worker), awaited
    through Ray. The worker must hold the actor's latest weights: the trainer brackets a batch of agent loops
    with the group's `rollout_mode()` / `trainer_mode()`."""

    def __init__(
        self,
        handle: Any,
        method_name: str = "generate_request",
        timeout_s: float | None = None,
        rank: int = 0,
        node: str = "unknown",
    ) -> None:
        """`timeout_s` bounds each turn (None: no limit); `rank` and `node` name the worker in that error."""
        self.handle = handle
        self.method_name = method_name
        self.method = getattr(handle, method_name)
        self.timeout_s = timeout_s
        self.rank, self.node = rank, node
        self._turns = itertools.count()

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams, **vision: Any
    ) -> TokenOutput:
        turn_id = f"{request_id}/{next(self._turns)}"
        pending = self.method.remote(list(prompt_ids), sampling_params, turn_id, **vision)
        try:
            return token_output(await asyncio.wait_for(pending, self.timeout_s))
        except TimeoutError:
            raise WorkerTimeoutError(
                ranks=[self.rank], method=self.method_name, timeout_s=self.timeout_s, nodes=[self.node]
            ) from None


class ServerRouter:
    """Routes each conversation to one server for all its turns; new conversations go to the least loaded one."""

    def __init__(self, servers: Sequence[AsyncLLMServer]) -> None:
        if not servers:
            raise ValueError("ServerRouter needs at least one generation server; got an empty list.")
        self.servers = list(servers)
        self.active = [0] * len(self.servers)  # conversations assigned and not yet released, per server
        self._assigned: dict[str, int] = {}

    def server_index(self, request_id: str) -> int:
        """The server of this conversation, assigning the least-loaded one (lowest index on ties) the first time."""
        if request_id not in self._assigned:
            index = min(range(len(self.servers)), key=lambda i: self.active[i])
            self._assigned[request_id] = index
            self.active[index] += 1
        return self._assigned[request_id]

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams, **vision: Any
    ) -> TokenOutput:
        server = self.servers[self.server_index(request_id)]
        return await server.generate(request_id, prompt_ids, sampling_params, **vision)

    def release(self, request_id: str) -> None:
        """The conversation is over: its server's load goes down."""
        index = self._assigned.pop(request_id, None)
        if index is not None:
            self.active[index] -= 1
