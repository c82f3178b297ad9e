"""Sample-level scheduling of agent loops for the fully asynchronous mode: every prompt group is a task of its own.

    groups = AgentGroups(manager, config.actor_rollout_ref.rollout, on_done=buffer_put, on_error=buffer.fail)
    groups.start(prompt, seed, index=j, epoch=e)   # returns at once; the group's rollout.n samples run as tasks
    groups.wait()                                  # until every group started has finished (the producer's end)
    groups.cancel()                                # stop: the tasks in flight are cancelled

The agent loops run on the manager's background event loop (`AgentLoopManager.start_background_loop`), where each
of a group's `rollout.n` samples is an asyncio task (`agenerate_sequences`), every turn a request of the rollout
pool's engines. A group is handed to `on_done` (the `RolloutBuffer`) the moment its last sample finishes, whatever
the others do: a slow multi-turn sample (a long tool call, many turns) holds back its own group only, never the
batch. Groups are the unit because GRPO-style advantages compare the samples of one prompt.

Policy versions: weights that reach the rollout pool while a group runs are loaded in flight (the engine pauses at
a step boundary, `ActorRolloutRefWorker.receive_weights`), so one sample's turns may come from several versions;
each token records its own (`rollout_policy_versions`, -1 on tool and user tokens) and the group's staleness is
that of its oldest token (`rollout_policy_version_min`), which the buffer's bound checks.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

from hyflow import fields as F
from hyflow.protocol import DataProto
from hyflow.trainer import stages
from hyflow.trainer.metrics import reduce_metrics

__all__ = ["AgentGroups", "generate_group"]


async def generate_group(manager: Any, prompt: DataProto, rollout: Any, seed: int) -> tuple[DataProto, dict]:
    """The `rollout.n` trajectories of one prompt (a batch of one row, with its uid), merged into the prompt's rows
    as the trainer's own generation does (`PPOTrainer._generate_batch`), and the loops' metrics."""
    batch = prompt.repeat(rollout.n, interleave=True)
    meta = {F.TEMPERATURE: rollout.temperature, F.DO_SAMPLE: rollout.do_sample, F.SEED: seed}
    output = await manager.agenerate_sequences(stages.generation_input(batch, True, meta))
    metrics = reduce_metrics(output.meta_info.get(F.METRICS, {}))
    batch = stages.merge_generation(batch, output)
    batch.meta_info.pop(F.SEED, None)  # per group: the trainer sets what a whole batch needs
    return batch, metrics


class AgentGroups:
    """The prompt groups in flight on the agent loops' event loop; finished ones go to `on_done` one by one."""

    def __init__(
        self,
        manager: Any,
        rollout: Any,
        on_done: Callable[[DataProto, int, int], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        """`on_done(batch, index, epoch)` receives a finished group, `on_error` the first failure of one."""
        self.manager, self.rollout = manager, rollout
        self.on_done, self.on_error = on_done, on_error
        self.last_metrics: dict[str, float] = {}
        self._in_flight: set[concurrent.futures.Future] = set()
        self._lock = threading.Condition()
        self._busy_s, self._busy_since = 0.0, 0.0  # wall time with at least one group in flight

    @property
    def busy_s(self) -> float:
        """Seconds so far during which at least one group was generating."""
        with self._lock:
            running = time.perf_counter() - self._busy_since if self._in_flight else 0.0
            return self._busy_s + running

    @property
    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def start(self, prompt: DataProto, seed: int, index: int, epoch: int) -> None:
        """Start the samples of one prompt group (generation index `index`) and return at once."""
        future = self.manager.submit(generate_group(self.manager, prompt, self.rollout, seed))
        with self._lock:
            if not self._in_flight:
                self._busy_since = time.perf_counter()
            self._in_flight.add(future)
        future.add_done_callback(lambda done: self._finished(done, index, epoch))

    def _finished(self, future: concurrent.futures.Future, index: int, epoch: int) -> None:
        """On the event loop's thread: hand the group over (or its error), then count it out."""
        try:
            if not future.cancelled():
                error = future.exception()
                if error is not None:
                    self.on_error(error)
                else:
                    batch, self.last_metrics = future.result()
                    self.on_done(batch, index, epoch)
        finally:
            with self._lock:
                self._in_flight.discard(future)
                if not self._in_flight:
                    self._busy_s += time.perf_counter() - self._busy_since
                    self._lock.notify_all()

    def wait(self) -> None:
        """Block until every group started so far has finished (or was cancelled)."""
        with self._lock:
            self._lock.wait_for(lambda: not self._in_flight)

    def cancel(self) -> None:
        with self._lock:
            pending = set(self._in_flight)
        for future in pending:
            future.cancel()
