"""The asynchronous hand-off between engine steps, in one place: what is queued on the device, what the next
`step()` reads, and what is queued ahead of it.

A launched step or decode window (`LaunchedBatch`) has its outputs on their way to pinned host memory behind it
(`send_columns`, an event recorded after the copies); `read_outputs` waits for that event only. So the engine can
queue the next batch *before* it reads this one, and append this batch's tokens while the device runs the next
(`EngineConfig.async_scheduling`). `InFlight` holds the one batch queued ahead and decides what it is:

    step k:   launched = in_flight.take()          the batch queued at step k-1, or a newly scheduled one
              in_flight.queue_behind(launched)     queue batch k+1 on the device (if it does not need k's tokens)
              read_outputs(launched)               the one host sync; then the host appends k's tokens

What can go ahead (scheduler.py): the next decode window, as if every sequence takes all its steps in this one
(`schedule_next_window`; its first inputs are `LaunchedBatch.last_tokens`, on the device), or the next prefill of
waiting sequences (`schedule_next_prefill`: a prefill reads only prompts). A queued batch whose rows all ended
before it was read is dropped unread; `drop()` (before sleep or a weight load) waits for the device to finish with
it, and its sequences are recomputed later, sampling the same tokens (the noise depends only on seed and index).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hyflow.engine.scheduler import ScheduledBatch, Scheduler
from hyflow.engine.sequence import SequenceStatus

# Per row: tokens (K), log-probs (K), raw log-probs (K) or None; top alternatives ((K, k) ids, log-probs) or None.
HostOutputs = tuple[
    list[list[int]],
    list[list[float]],
    list[list[float]] | None,
    tuple[list[list[list[int]]], list[list[list[float]]]] | None,
]


@dataclass
class LaunchedBatch:
    """A scheduled batch queued on the device — a decode window of K steps, or one forward step (K = 1): the batch,
    its outputs on their way to the host, and each row's last token on the device (the first input of a window
    queued behind it)."""

    batch: ScheduledBatch
    outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # (B, K) tokens, log-probs, raw log-probs
    last_tokens: torch.Tensor  # (B,) long, on the device
    ready: torch.cuda.Event | None  # recorded after the copies to the host (CUDA)
    top: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, K, k) ids and log-probs of the top alternatives


def send_columns(
    batch: ScheduledBatch,
    tokens: torch.Tensor,
    log_probs: torch.Tensor,
    raw: torch.Tensor | None,
    top: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> LaunchedBatch:
    """Queues the copy of outputs (B, K) (and top alternatives (B, K, k)) to the host without waiting: on CUDA into
    pinned memory, with an event recorded behind the copies (a one-step launch passes K = 1)."""
    last_tokens = tokens[:, -1].clone()
    copy = _to_pinned_host if tokens.is_cuda else torch.Tensor.clone
    views = tuple(None if view is None else copy(view) for view in (tokens, log_probs, raw))
    host_top = None if top is None else (copy(top[0]), copy(top[1]))
    ready = None
    if tokens.is_cuda:
        ready = torch.cuda.Event()
        ready.record()
    return LaunchedBatch(batch, views, last_tokens, ready, host_top)


def _to_pinned_host(tensor: torch.Tensor) -> torch.Tensor:
    """A copy in pinned host memory, queued on the current stream (valid once an event recorded after it fired)."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor, non_blocking=True)


def read_outputs(launched: LaunchedBatch) -> HostOutputs:
    """The outputs per row (tokens, log-probs, raw log-probs or None, top alternatives or None), K each; entries
    past a row's step count are meaningless. The one deliberate host sync of a step or window (the scheduler needs
    the tokens); it waits for this batch only, not for one queued behind it."""
    if launched.ready is not None:
        launched.ready.synchronize()
    tokens, log_probs, raw = launched.outputs
    top = None if launched.top is None else (launched.top[0].tolist(), launched.top[1].tolist())
    return tokens.tolist(), log_probs.tolist(), None if raw is None else raw.tolist(), top


Launch = Callable[[ScheduledBatch, LaunchedBatch | None], LaunchedBatch]


class InFlight:
    """The batch queued on the device ahead of the one being read (async scheduling), and the decision of what
    that is. `launch(batch, after)` queues a batch (model_runner.ModelRunner.launch)."""

    def __init__(self, scheduler: Scheduler, launch: Launch, queue_ahead: bool) -> None:
        self.scheduler, self.launch, self.queue_ahead = scheduler, launch, queue_ahead
        self.queued: LaunchedBatch | None = None
        self.num_queued_ahead = 0  # a diagnostic: batches queued before the one before them was read

    def take(self) -> LaunchedBatch | None:
        """The batch this step reads: the one queued ahead (unless every row of it has ended meanwhile), else the
        scheduler's next batch, launched now; None when nothing runs."""
        launched, self.queued = self.queued, None
        if launched is not None and all(seq.status == SequenceStatus.FINISHED for seq in launched.batch.seqs):
            launched = None  # every row stopped in the window before (or was aborted): nothing to read
        if launched is None:
            batch = self.scheduler.schedule()
            if not batch.seqs:
                return None
            launched = self.launch(batch, None)
        return launched

    def queue_behind(self, launched: LaunchedBatch) -> None:
        """With async scheduling, queues what follows `launched` before its outputs are read, where that does not
        depend on them: the next decode window behind a window, the next prefill behind a prefill."""
        if not self.queue_ahead:
            return
        batch = launched.batch
        if batch.is_window:
            following = self.scheduler.schedule_next_window(batch)
        elif batch.is_prefill:
            following = self.scheduler.schedule_next_prefill()
        else:
            following = None
        if following is not None:
            self.num_queued_ahead += 1
            self.queued = self.launch(following, launched)

    def drop(self) -> None:
        """Forgets the queued batch once the device is done with it (so that nothing queued writes to a freed KV
        cache or computes with old weights)."""
        queued, self.queued = self.queued, None
        if queued is not None and queued.ready is not None:
            queued.ready.synchronize()
