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

A launched window (`send_outputs`) also queues the copy of its outputs to pinned host memory; in_flight.py owns that
hand-off and what is queued behind it (async scheduling). The window's device state is decode_state.DecodeState.
Shapes: B sequences (rows), K steps of the window, M blocks per sequence.
"""

from __future__ import annotations

import torch

from hyflow.engine import triton_kernels, triton_step
from hyflow.engine.attention import AttentionMetadata
from hyflow.engine.decode_state import DecodeState, Forward
from hyflow.engine.in_flight import LaunchedBatch, send_columns
from hyflow.engine.sampler import sample, top_alternatives
from hyflow.engine.scheduler import ScheduledBatch


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
    logits = forward(state.input_ids, state.rope_positions(), meta)
    st = state.sampling
    if logits.is_cuda and not st.need_filter and not st.num_top and triton_step.available():
        partials = triton_kernels.sample_partials(logits, st.temperatures, st.seeds, st.counters, st.need_raw)
        triton_step.finish_step(logits, partials, st.temperatures, state, block_size, scratch_slot)
        return
    tokens, log_probs, raw = sample(logits, state.sampling)
    state.tokens.index_copy_(1, state.step, tokens.unsqueeze(1))
    state.log_probs.index_copy_(1, state.step, log_probs.float().unsqueeze(1))
    if raw is not None:
        state.raw_log_probs.index_copy_(1, state.step, raw.float().unsqueeze(1))
    if state.top_ids is not None:
        top_ids, top_log_probs = top_alternatives(logits, st)
        state.top_ids.index_copy_(1, state.step, top_ids.unsqueeze(1))
        state.top_log_probs.index_copy_(1, state.step, top_log_probs.unsqueeze(1))
    advance(state, tokens, block_size, scratch_slot)


def send_outputs(state: DecodeState, batch: ScheduledBatch) -> LaunchedBatch:
    """Queues the copy of a window's outputs to the host behind its steps, without waiting (on CUDA into pinned
    memory): the device buffers, shared by all windows of a CUDA graph, may then be overwritten by the next window."""
    rows, steps = len(batch.seqs), batch.num_steps
    raw = None if state.raw_log_probs is None else state.raw_log_probs[:rows, :steps]
    top = None if state.top_ids is None else (state.top_ids[:rows, :steps], state.top_log_probs[:rows, :steps])
    return send_columns(batch, state.tokens[:rows, :steps], state.log_probs[:rows, :steps], raw, top)
