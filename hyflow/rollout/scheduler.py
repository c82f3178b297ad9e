"""Continuous batching: which sequences run in the next forward step.

Every step is either a prefill (admit waiting sequences, oldest first, while the step's token budget
`max_num_batched_tokens`, the `max_num_seqs` limit and the free cache blocks allow) or, when nothing can be
admitted, a decode of every running sequence (one token each). Requests join and leave between any two steps.

When a decode needs a new block and none is free, the most recently admitted running sequence is preempted: its
blocks are freed and it goes back to the front of the queue, to be recomputed from its tokens later (its full
blocks are usually still found by hash). The sampler's randomness depends only on (seed, token index), so a
preempted sequence continues exactly as it would have.
"""

from __future__ import annotations

import logging
from collections import deque

from hyflow.rollout.block_manager import BlockManager
from hyflow.rollout.config import EngineConfig
from hyflow.rollout.sequence import FinishReason, Sequence, SequenceStatus

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The sequences of the next step and whether it is a prefill."""
        scheduled = self._schedule_prefill()
        if scheduled:
            return scheduled, True
        return self._schedule_decode(), False

    def _schedule_prefill(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        num_tokens = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if num_tokens + len(seq) > self.max_num_batched_tokens or not self.block_manager.can_allocate(seq):
                break
            self.block_manager.allocate(seq)
            num_tokens += len(seq) - seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(self.waiting.popleft())
            scheduled.append(seq)
        return scheduled

    def _schedule_decode(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        while self.running and len(scheduled) < self.max_num_seqs:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self.preempt(self.running.pop())
                else:
                    self.preempt(seq)
                    break
            else:
                self.block_manager.append_slot(seq)
                scheduled.append(seq)
        self.running.extendleft(reversed(scheduled))
        return scheduled

    def preempt(self, seq: Sequence) -> None:
        self.num_preemptions += 1
        logger.debug("preempting sequence %d (%d tokens): KV cache full", seq.seq_id, len(seq))
        seq.status = SequenceStatus.WAITING
        self.block_manager.deallocate(seq)
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Ends a sequence (done or aborted): frees its blocks and drops it from the queues."""
        if seq.status == SequenceStatus.RUNNING:
            self.block_manager.deallocate(seq)
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.finish(reason)

    def preempt_all(self) -> None:
        """Moves every running sequence back to the queue (before the KV cache is freed)."""
        while self.running:
            self.preempt(self.running.pop())
