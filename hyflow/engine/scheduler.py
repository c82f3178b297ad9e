"""Continuous batching: which sequences run in the next forward step.

Every step is either a prefill (admit waiting sequences, oldest first, while the step's token budget
`max_num_batched_tokens`, the `max_num_seqs` limit and the free cache blocks allow) or, when nothing can be
admitted, a decode of every running sequence (one token each). Requests join and leave between any two steps.

A decode is a window of up to `num_scheduler_steps` steps that the model runner runs on the device without a host
round trip (multi_step.py). Before the window every running sequence gets cache slots for all its steps; each
sequence takes part in at most its remaining token budget (`max_tokens`, `max_model_len`) of steps and idles for
the rest, and the window is as long as the largest budget. When the free blocks cannot hold the window, it shrinks
step by step; a window of one step is a plain decode step.

With async scheduling (`EngineConfig.async_scheduling`) the engine queues the next window while the device still
runs the current one (`schedule_next_window`): it assumes every sequence takes all its steps in the current window,
so it starts `pending` tokens further on, reserves slots for both windows, and leaves out the sequences whose
budget the current window uses up. A sequence that stops early in the current window wastes its row of the next
one; its outputs there are dropped. Nothing is queued ahead while sequences wait to be admitted or blocks are short.
Prefills are queued ahead too (`schedule_next_prefill`): a prefill reads only prompts, so the next one does not wait
for the tokens of the one before, and the host prepares it while the device computes.

When a decode needs a new block and none is free, the most recently admitted running sequence is preempted: its
blocks are freed and it goes back to the front of the queue, to be recomputed from its tokens later (its full
blocks are usually still found by hash). The sampler's randomness depends only on (seed, token index), so a
preempted sequence continues exactly as it would have.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from hyflow.engine.block_manager import BlockManager
from hyflow.engine.config import EngineConfig
from hyflow.engine.sequence import FinishReason, Sequence, SequenceStatus

logger = logging.getLogger(__name__)


@dataclass
class ScheduledBatch:
    """The sequences of the next forward step (prefill or decode), or of a decode window of `num_steps` steps in
    which sequence i runs the first `step_counts[i]` steps (its remaining token budget) and then idles. A window
    queued behind another starts `pending[i]` tokens after sequence i's last appended token."""

    seqs: list[Sequence]
    is_prefill: bool
    num_steps: int = 1
    step_counts: list[int] = field(default_factory=list)  # one per sequence when num_steps > 1
    pending: list[int] | None = None  # per sequence: tokens the window before this one is still producing

    @property
    def is_window(self) -> bool:
        return self.num_steps > 1


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        assert config.max_model_len is not None, "EngineConfig.check_model_len must run first"
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.num_scheduler_steps = config.num_scheduler_steps
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """The next step: a prefill if a waiting sequence can be admitted, else a decode (window) of the running."""
        scheduled = self._schedule_prefill()
        if scheduled:
            return ScheduledBatch(scheduled, is_prefill=True)
        if not self.running:
            return ScheduledBatch([], is_prefill=False)
        budgets = [self.token_budget(seq) for seq in self.running]
        num_steps = self._window_size(budgets)
        if num_steps == 1:
            return ScheduledBatch(self._schedule_decode(), is_prefill=False)
        assert len(self.running) <= self.max_num_seqs
        step_counts = [min(num_steps, budget) for budget in budgets]
        for seq, count in zip(self.running, step_counts):
            self.block_manager.reserve_slots(seq, count)
        return ScheduledBatch(list(self.running), False, num_steps, step_counts)

    def schedule_next_window(self, window: ScheduledBatch) -> ScheduledBatch | None:
        """The decode window to queue behind `window` (running on the device, its tokens not appended yet), as if
        every sequence takes all its steps there; None when sequences wait for admission, when fewer than two steps
        are left, or when the free blocks cannot hold both windows (the engine then waits and schedules as usual).
        One pass over the rows (it runs every window, at 1024 rows a large part of the host's work)."""
        if self.waiting:
            return None
        seqs, pending, budgets = [], [], []
        for seq, count in zip(window.seqs, window.step_counts):
            budget = self.token_budget(seq) - count
            if budget > 0 and seq.status is SequenceStatus.RUNNING:
                seqs.append(seq)
                pending.append(count)
                budgets.append(budget)
        num_steps = min(self.num_scheduler_steps, max(budgets, default=0))
        if num_steps < 2:
            return None
        step_counts = [budget if budget < num_steps else num_steps for budget in budgets]
        block_size, needs = self.block_manager.block_size, []
        for seq, ahead, count in zip(seqs, pending, step_counts):
            # blocks for positions len-1 .. len+ahead+count-2 (BlockManager.num_blocks_to_reserve)
            missing = (seq.num_tokens + ahead + count - 2) // block_size + 1 - len(seq.block_table)
            if missing > 0:
                needs.append((seq, missing))
        if sum(missing for _, missing in needs) > self.block_manager.num_free_blocks:
            return None
        for seq, missing in needs:
            self.block_manager.append_blocks(seq, missing)
        return ScheduledBatch(seqs, False, num_steps, step_counts, pending)

    def schedule_next_prefill(self) -> ScheduledBatch | None:
        """A prefill of waiting sequences to queue behind one still on the device (its tokens not appended yet),
        or None when none can be admitted. It does not depend on the step before: a prefill reads only prompts."""
        scheduled = self._schedule_prefill()
        return ScheduledBatch(scheduled, is_prefill=True) if scheduled else None

    def token_budget(self, seq: Sequence) -> int:
        """How many more tokens a running sequence may generate before `max_tokens` or `max_model_len`."""
        return min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens)

    def _window_size(self, budgets: list[int]) -> int:
        """Steps of the next decode window: up to `num_scheduler_steps` and the largest budget, fewer while the free
        blocks cannot hold every sequence's slots (down to 1: a plain decode step, which may preempt)."""
        num_steps = min(self.num_scheduler_steps, max(budgets))
        free = self.block_manager.num_free_blocks
        while num_steps > 1:
            needed = sum(
                self.block_manager.num_blocks_to_reserve(seq, min(num_steps, budget))
                for seq, budget in zip(self.running, budgets)
            )
            if needed <= free:
                break
            num_steps -= 1
        return num_steps

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
