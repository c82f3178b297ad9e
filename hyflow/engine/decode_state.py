"""The device state of a decode window: each step's inputs, advanced in place, and the window's output buffers.

Its own module because three others read it: the steps themselves (multi_step.py), the fused step end
(triton_step.py) and the CUDA graphs' static buffers (cuda_graphs.py).
Shapes: B sequences (rows), K steps of the window, M blocks per sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hyflow.engine.attention import AttentionMetadata
from hyflow.engine.sampler import SamplingTensors

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
    top_ids: torch.Tensor | None = None  # (B, K, k) long when `sampling.num_top` = k > 0
    top_log_probs: torch.Tensor | None = None  # (B, K, k) float
    rope_offsets: torch.Tensor | None = None  # (B,) long: image sequences' decode shift of the rotary position

    def rope_positions(self) -> torch.Tensor:
        """The positions the rotary embedding reads: `positions`, shifted for image sequences (mrope.py)."""
        return self.positions if self.rope_offsets is None else self.positions + self.rope_offsets

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
    rope_offsets: torch.Tensor | None = None,
) -> DecodeState:
    """A state that advances the given tensors in place, with fresh output buffers (the eager path)."""
    batch, device, top = input_ids.shape[0], input_ids.device, sampling.num_top
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
        top_ids=torch.zeros(batch, num_steps, top, dtype=torch.long, device=device) if top else None,
        top_log_probs=torch.zeros(batch, num_steps, top, dtype=torch.float32, device=device) if top else None,
        rope_offsets=rope_offsets,
    )
