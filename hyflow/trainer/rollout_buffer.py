"""The fully asynchronous mode's buffer: generated chunks wait here, tagged with the policy version that sampled
them, until the trainer takes a batch; the staleness bound is enforced on both sides of it.

    buffer = RolloutBuffer(groups_per_batch=8, max_staleness=2)
    buffer.admit(index=j, rollout_version=v)        # producer: blocks until chunk j may start (never started)
    buffer.put(Chunk(batch, version=v, num_groups=1))
    chunks = buffer.take(trainer_version=V)          # trainer: blocks until 8 fresh groups; stale ones dropped

Versions count optimizer steps: the weights after step k are version k. A chunk sampled with version v and trained
on by weights of version V has staleness V − v. The bound `max_staleness` holds two ways:
- never started: the j-th group (0-based, in generation order) is trained at the earliest in step ⌊j / B⌋ + 1 by
  the weights of version ⌊j / B⌋ (B = groups per batch), so it may start only once the rollout holds a version
  v ≥ ⌊j / B⌋ − max_staleness (`admit`); with max_staleness = 0 this is exactly synchronous training;
- dropped: `take` discards any chunk with V − v > max_staleness and counts its groups (`num_dropped_groups`), so
  the bound holds whatever the timing (e.g. groups that arrived late, or after a resume).
A producer that fails hands its exception to the trainer: the next `take` raises it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from hyflow.protocol import DataProto

__all__ = ["Chunk", "RolloutBuffer"]


@dataclass
class Chunk:
    """One generation request's result: `num_groups` prompts with their samples, and the version that sampled them."""

    batch: DataProto
    version: int
    num_groups: int
    epoch: int = 0  # of the prompts
    index: int = 0  # generation index of its first group (chunks may finish out of order)


class RolloutBuffer:
    """A FIFO of generated chunks shared by one producer thread and the trainer (thread-safe)."""

    def __init__(self, groups_per_batch: int, max_staleness: int) -> None:
        self.groups_per_batch = groups_per_batch
        self.max_staleness = max_staleness
        self._chunks: deque[Chunk] = deque()
        self._cond = threading.Condition()
        self._rollout_version = 0
        self._error: BaseException | None = None
        self._closed = False
        self._finished = False  # the producer has no prompts left
        self.num_dropped_groups = 0  # over the whole run
        self.admit_wait_s = 0.0  # producer time spent waiting on the bound, since the last `take`

    # ---- producer side ----
    def set_rollout_version(self, version: int) -> None:
        """The version the rollout workers hold now (after a weight transfer); wakes a waiting `admit`."""
        with self._cond:
            self._rollout_version = version
            self._cond.notify_all()

    def admit(self, index: int) -> bool:
        """Block until the group at generation index `index` may start under the bound; False once closed."""
        started = time.perf_counter()
        with self._cond:
            while not self._closed and index // self.groups_per_batch - self._rollout_version > self.max_staleness:
                self._cond.wait()
            self.admit_wait_s += time.perf_counter() - started
            return not self._closed

    def put(self, chunk: Chunk) -> None:
        with self._cond:
            self._chunks.append(chunk)
            self._cond.notify_all()

    def finish(self) -> None:
        """The producer generated its last chunk: a `take` that cannot fill a batch any more returns []."""
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The producer stopped with `error`: the trainer's next `take` raises it."""
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def close(self) -> None:
        """Stop: a waiting `admit` returns False, a waiting `take` raises."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ---- trainer side ----
    def pop_admit_wait(self) -> float:
        """Seconds the producer waited on the bound since the last call (the rollout pool's forced idle time)."""
        with self._cond:
            waited, self.admit_wait_s = self.admit_wait_s, 0.0
            return waited

    @property
    def num_groups(self) -> int:
        with self._cond:
            return sum(chunk.num_groups for chunk in self._chunks)

    def _drop_stale(self, trainer_version: int) -> None:
        kept = deque(c for c in self._chunks if trainer_version - c.version <= self.max_staleness)
        self.num_dropped_groups += sum(c.num_groups for c in self._chunks) - sum(c.num_groups for c in kept)
        self._chunks = kept

    def take(self, trainer_version: int) -> list[Chunk]:
        """The oldest chunks holding `groups_per_batch` groups, none staler than the bound for weights of version
        `trainer_version` (older ones are dropped first); blocks until there are enough, [] when there never will
        be (the producer finished)."""
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if self._closed:
                    raise RuntimeError("the rollout buffer was closed while the trainer waited for a batch")
                self._drop_stale(trainer_version)
                if sum(c.num_groups for c in self._chunks) >= self.groups_per_batch:
                    break
                if self._finished:
                    return []
                self._cond.wait()
            taken, num_groups = [], 0
            while num_groups < self.groups_per_batch:
                chunk = self._chunks.popleft()
                taken.append(chunk)
                num_groups += chunk.num_groups
            assert num_groups == self.groups_per_batch, "chunk sizes divide the batch (checked at config load)"
            self._cond.notify_all()
            return taken
