"""Multi-step decode: a window of K decode steps back to back on the device, with one host sync at its end.

The scheduler gives every sequence the cache slots of all its steps before the window (scheduler.py). Each step
    logits = model(input_ids, positions, meta);   token, log_prob = sample(logits)
    out[b, k] = token, log_prob                                   (device buffers (B, K); read once per window)
and then makes the next step's inputs from this step's outputs, on the device:
    active = steps_left > 0;   steps_left -= 1;   counters += 1;   input_ids = token;   positions += active
    slot_mapping = active ? block_tables[b, pos // block_size] * block_size + pos % block_size : scratch slot
Row b takes part in its first `step_counts[b]` steps (its remaining token budget) and then idles: its position stays,
its K/V go to the scratch block, and its later tokens are ignored. After the window the host appends each row's
tokens and runs the stop checks token by token (engine.py); a row that stopped at token j keeps tokens 0..j.

The tokens are those of K single steps: step k+1 sees the same cache and inputs a separate step would, and the
sampler's noise depends only on (seed, output index). On CUDA one step (forward, sample, record, advance) is one
CUDA graph (cuda_graphs.py), so the host only launches K replays.

A launched window (`send_outputs`) also queues the copy of its outputs to pinned host memory and records an event;
`read_outputs` waits for that event only, so the engine can queue the next window first (async scheduling, see
scheduler.py) and append this window's tokens while the device runs the next one. The next window takes its first
inputs from `LaunchedBatch.last_tokens` on the device.
Shapes: B sequences (rows), K steps of the window, M blocks per sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hyflow.engine import triton_kernels, triton_step
from hyflow.engine.attention import AttentionMetadata
from hyflow.engine.sampler import SamplingTensors, sample
from hyflow.engine.scheduler import ScheduledBatch

Forward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


@dataclass
class DecodeState:
    """The device tensors of a decode window; each step reads its inputs here and advances them in place."""

    input_ids: torch.Tensor  # (B,) long: the token each row feeds in the current step
    positions: torch.Tensor  # (B,) long: that token's position
    slot_mapping: torch.Tensor  # (B,) long: the cache slot its K/V go to
    block_tables: torch.Tensor  # (B, M) long
    steps_left: torch.Tensor  # (B,) long: how many more steps the row takes part in after the current one
    sampling: SamplingTensors  # its `counters` advance with the steps
    step: torch.Tensor  # (1,) long: index of the current step in the window (the output column)
    tokens: torch.Tensor  # (B, K) long
    log_probs: torch.Tensor  # (B, K) float
    raw_log_probs: torch.Tensor | None  # (B, K) float when `sampling.need_raw`
    rows: torch.Tensor  # (B,) long: 0..B-1

    def metadata(self) -> AttentionMetadata:
        """Attention metadata of a step: views of the state, so each step sees the advanced values."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping,
            block_tables=self.block_tables,
            query_index=self.rows.unsqueeze(1),
            query_positions=self.positions.unsqueeze(1),
            token_index=self.rows,
            logits_index=self.rows,
        )


def new_decode_state(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    meta: AttentionMetadata,
    sampling: SamplingTensors,
    steps_left: torch.Tensor,
    num_steps: int,
) -> DecodeState:
    """A state that advances the given tensors in place, with fresh output buffers (the eager path)."""
    batch, device = input_ids.shape[0], input_ids.device
    return DecodeState(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=meta.slot_mapping,
        block_tables=meta.block_tables,
        steps_left=steps_left,
        sampling=sampling,
        step=torch.zeros(1, dtype=torch.long, device=device),
        tokens=torch.zeros(batch, num_steps, dtype=torch.long, device=device),
        log_probs=torch.zeros(batch, num_steps, dtype=torch.float32, device=device),
        raw_log_probs=torch.zeros(batch, num_steps, dtype=torch.float32, device=device) if sampling.need_raw else None,
        rows=torch.arange(batch, device=device),
    )


def advance(state: DecodeState, tokens: torch.Tensor, block_size: int, scratch_slot: int) -> None:
    """Makes the next step's inputs from this step's sampled tokens (B,), in place (see the module docstring)."""
    state.input_ids.copy_(tokens)
    active = state.steps_left > 0
    state.steps_left.sub_(1)
    state.positions.add_(active.long())
    positions = state.positions
    blocks = state.block_tables.gather(1, (positions // block_size).unsqueeze(1)).squeeze(1)
    state.slot_mapping.copy_(torch.where(active, blocks * block_size + positions % block_size, scratch_slot))
    state.sampling.counters.add_(1)
    state.step.add_(1)


def decode_step(
    forward: Forward, state: DecodeState, meta: AttentionMetadata, block_size: int, scratch_slot: int
) -> None:
    """One step of the window: forward, sample, record the outputs in column `state.step`, advance (on CUDA
    without top-k/top-p: the sampler kernel and one kernel for the rest, triton_step.py)."""
    logits = forward(state.input_ids, state.positions, meta)
    st = state.sampling
    if logits.is_cuda and not st.need_filter and triton_step.available():
        partials = triton_kernels.sample_partials(logits, st.temperatures, st.seeds, st.counters)
        triton_step.finish_step(logits, partials, st.temperatures, state, block_size, scratch_slot)
        return
    tokens, log_probs, raw = sample(logits, state.sampling)
    state.tokens.index_copy_(1, state.step, tokens.unsqueeze(1))
    state.log_probs.index_copy_(1, state.step, log_probs.float().unsqueeze(1))
    if raw is not None:
        state.raw_log_probs.index_copy_(1, state.step, raw.float().unsqueeze(1))
    advance(state, tokens, block_size, scratch_slot)


@dataclass
class LaunchedBatch:
    """A scheduled batch queued on the device — a decode window of K steps, or one forward step (K = 1): the batch,
    its outputs on their way to the host, and each row's last token on the device (the first input of a window
    queued behind it)."""

    batch: ScheduledBatch
    outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # (B, K) tokens, log-probs, raw log-probs
    last_tokens: torch.Tensor  # (B,) long, on the device
    ready: torch.cuda.Event | None  # recorded after the copies to the host (CUDA)


def send_outputs(state: DecodeState, batch: ScheduledBatch) -> LaunchedBatch:
    """Queues the copy of a window's outputs to the host behind its steps, without waiting (on CUDA into pinned
    memory): the device buffers, shared by all windows of a CUDA graph, may then be overwritten by the next window."""
    rows, steps = len(batch.seqs), batch.num_steps
    raw = None if state.raw_log_probs is None else state.raw_log_probs[:rows, :steps]
    return send_columns(batch, state.tokens[:rows, :steps], state.log_probs[:rows, :steps], raw)


def send_columns(
    batch: ScheduledBatch, tokens: torch.Tensor, log_probs: torch.Tensor, raw: torch.Tensor | None
) -> LaunchedBatch:
    """`send_outputs` for outputs (B, K) given as tensors (a one-step launch passes K = 1)."""
    views = (tokens, log_probs, raw)
    last_tokens = tokens[:, -1].clone()
    if not tokens.is_cuda:
        return LaunchedBatch(batch, tuple(None if view is None else view.clone() for view in views), last_tokens, None)
    host = tuple(None if view is None else _to_pinned_host(view) for view in views)
    ready = torch.cuda.Event()
    ready.record()
    return LaunchedBatch(batch, host, last_tokens, ready)


def _to_pinned_host(tensor: torch.Tensor) -> torch.Tensor:
    """A copy in pinned host memory, queued on the current stream (valid once an event recorded after it fired)."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor, non_blocking=True)


def read_outputs(launched: LaunchedBatch) -> tuple[list[list[int]], list[list[float]], list[list[float]] | None]:
    """The outputs per row (tokens, log-probs, raw log-probs or None), K each; entries past a row's step count are
    meaningless. The one deliberate host sync of a step or window (the scheduler needs the tokens); it waits for
    this batch only, not for one queued behind it."""
    if launched.ready is not None:
        launched.ready.synchronize()
    tokens, log_probs, raw = launched.outputs
    return tokens.tolist(), log_probs.tolist(), None if raw is None else raw.tolist()
