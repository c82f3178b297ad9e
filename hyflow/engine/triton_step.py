"""One Triton launch that ends a decode-window step: the sampler's split combine, recording the outputs and advancing
the row's inputs (multi_step.py), instead of ~30 tiny PyTorch ops per step on the CUDA path.

Per row b, from the sampler kernel's per-split partials (triton_kernels.sample_partials), with M = max_i m_i:

    token = tokens[b, argmax_i keys[b, i]]                 (the first split on ties)
    lse = M + log Σ_i s_i · exp(m_i − M)                   (and raw_lse from the raw partials)
    log_prob = logits[b, token] / T_b − lse;   raw = logits[b, token] − raw_lse      (T_b = 1 for greedy rows)
    out[b, step] = token, log_prob, raw
    active = steps_left > 0;  steps_left −= 1;  counters += 1;  input_ids = token;  positions += active
    slot_mapping = active ? block_tables[b, pos // block_size] · block_size + pos % block_size : scratch slot

which is what `sampler.sample_fused` followed by `multi_step.decode_step`'s record and `advance` compute.
`available()` says whether Triton and CUDA are there.
"""

from __future__ import annotations

import torch

from hyflow.engine import triton_kernels
from hyflow.engine.decode_state import DecodeState
from hyflow.engine.triton_kernels import available, tl, triton  # noqa: F401 (available: this module's API)

if triton is not None:

    @triton.jit
    def _combine_lse(maxes, sums, mask):
        top = tl.max(tl.where(mask, maxes, -float("inf")), 0)
        return top + tl.log(tl.sum(tl.where(mask, sums * tl.exp(maxes - top), 0.0), 0))

    @triton.jit
    def _finish_step_kernel(
        logits_ptr,
        logits_stride,
        keys_ptr,
        split_tokens_ptr,
        maxes_ptr,
        sums_ptr,
        raw_maxes_ptr,
        raw_sums_ptr,
        temperatures_ptr,
        step_ptr,
        out_tokens_ptr,
        out_log_probs_ptr,
        out_raw_ptr,
        out_stride,
        input_ids_ptr,
        positions_ptr,
        slot_mapping_ptr,
        block_tables_ptr,
        table_stride,
        steps_left_ptr,
        counters_ptr,
        block_size,
        scratch_slot,
        num_splits,
        SPLITS_PAD: tl.constexpr,
        NEED_RAW: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, SPLITS_PAD)
        mask = i < num_splits
        partials = b * num_splits + i
        keys = tl.load(keys_ptr + partials, mask=mask, other=-float("inf"))
        best = tl.argmax(keys, 0, tie_break_left=True)
        token = tl.load(split_tokens_ptr + b * num_splits + best)
        maxes = tl.load(maxes_ptr + partials, mask=mask, other=0.0)
        lse = _combine_lse(maxes, tl.load(sums_ptr + partials, mask=mask, other=0.0), mask)
        picked = tl.load(logits_ptr + b * logits_stride + token).to(tl.float32)
        temperature = tl.load(temperatures_ptr + b)
        divisor = tl.where(temperature == 0.0, 1.0, temperature)
        step = tl.load(step_ptr)
        tl.store(out_tokens_ptr + b * out_stride + step, token)
        tl.store(out_log_probs_ptr + b * out_stride + step, picked / divisor - lse)
        if NEED_RAW:
            raw_maxes = tl.load(raw_maxes_ptr + partials, mask=mask, other=0.0)
            raw_lse = _combine_lse(raw_maxes, tl.load(raw_sums_ptr + partials, mask=mask, other=0.0), mask)
            tl.store(out_raw_ptr + b * out_stride + step, picked - raw_lse)
        tl.store(input_ids_ptr + b, token)
        steps_left = tl.load(steps_left_ptr + b)
        active = steps_left > 0
        tl.store(steps_left_ptr + b, steps_left - 1)
        position = tl.load(positions_ptr + b) + active.to(tl.int64)
        tl.store(positions_ptr + b, position)
        block = tl.load(block_tables_ptr + b * table_stride + position // block_size)
        tl.store(slot_mapping_ptr + b, tl.where(active, block * block_size + position % block_size, scratch_slot))
        tl.store(counters_ptr + b, tl.load(counters_ptr + b) + 1)


def finish_step(
    logits: torch.Tensor,
    partials: triton_kernels.SamplePartials,
    temperatures: torch.Tensor,
    state: DecodeState,
    block_size: int,
    scratch_slot: int,
) -> None:
    """Combine the sampler's partials for `logits` (B, V), record the step's outputs in `state` and advance its
    inputs, in one launch; then move `state.step` on."""
    batch, num_splits = partials.keys.shape
    raw = state.raw_log_probs
    outputs = [state.tokens, state.log_probs] + ([] if raw is None else [raw])
    strides = {tensor.stride(0) for tensor in outputs}
    assert len(strides) == 1, "the output buffers share one row stride"
    _finish_step_kernel[(batch,)](
        logits, logits.stride(0), partials.keys, partials.tokens, partials.maxes, partials.sums,
        partials.raw_maxes, partials.raw_sums, temperatures, state.step,
        state.tokens, state.log_probs, state.log_probs if raw is None else raw, state.tokens.stride(0),
        state.input_ids, state.positions, state.slot_mapping, state.block_tables, state.block_tables.stride(0),
        state.steps_left, state.sampling.counters, block_size, scratch_slot, num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits), NEED_RAW=raw is not None,
    )  # fmt: skip
    state.step.add_(1)
