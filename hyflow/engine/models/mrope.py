"""Multimodal rotary positions (M-RoPE, Qwen2-VL): three position rows (temporal, height, width) per token.

Positions of a prompt of P tokens (`mrope_positions`), with s the position after everything before:

    text token:                      (s, s, s),  then s += 1
    image k, grid (t, h, w) patches, merge size m: its t*(h/m)*(w/m) pad tokens, in raster order over (ti, hi, wi),
                                     (s + ti, s + hi, s + wi),  then s += max(t, h/m, w/m)

Every generated token (index i >= P) gets i + delta on all three rows, delta = max(prompt positions) + 1 - P: the
decode continues one past the prompt's largest position (transformers' `rope_deltas`). With all three rows equal,
M-RoPE is plain RoPE at that position, so decode steps (and their CUDA graphs) run the text path with positions
shifted by each sequence's delta; only prefills of image prompts read three rows.

The rotation (`MRotaryEmbedding`): the d/2 frequencies of `inv_freq` are split into `mrope_section` = (s_t, s_h,
s_w) consecutive groups; group r takes its angle from row r:

    angle[j] = pos[row(j)] * inv_freq[j],  row(j) = 0, 1, 2 for j in the 1st, 2nd, 3rd group;  cos/sin doubled to d

Shapes: positions (3, T) or (T,); q (T, H, D), k (T, Hkv, D); the cos/sin tables are (max_positions, D).
"""

from __future__ import annotations

from typing import Any

import torch

from hyflow.engine.models.ops import apply_rope
from hyflow.engine.models.rope import RotaryEmbedding


def mrope_positions(
    token_ids: list[int], image_grids: list[tuple[int, int, int]], image_token_id: int, merge_size: int
) -> tuple[torch.Tensor, int]:
    """(positions (3, P), delta) of one prompt (see the module docstring). Image k takes the next
    t*h*w / merge_size^2 image pad tokens; the caller checks that the counts add up."""
    rows: list[torch.Tensor] = []
    next_pos, i, images = 0, 0, iter(image_grids)
    while i < len(token_ids):
        if token_ids[i] != image_token_id:
            j = i
            while j < len(token_ids) and token_ids[j] != image_token_id:
                j += 1
            rows.append(torch.arange(next_pos, next_pos + j - i).expand(3, -1))
            next_pos, i = next_pos + j - i, j
            continue
        t, h, w = next(images)
        h, w = h // merge_size, w // merge_size
        grid = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
        rows.append(torch.stack(grid).reshape(3, -1) + next_pos)
        next_pos, i = next_pos + max(t, h, w), i + t * h * w
    positions = torch.cat(rows, dim=1)
    return positions, int(positions.max()) + 1 - len(token_ids)


class MRotaryEmbedding(RotaryEmbedding):
    """RoPE that also takes three position rows (T tokens: (3, T)); one row (T,) is plain RoPE."""

    def __init__(self, head_dim: int, max_positions: int, params: dict[str, Any]) -> None:
        super().__init__(head_dim, max_positions, params)
        section = torch.tensor(params["mrope_section"])
        if int(section.sum()) != head_dim // 2:
            raise ValueError(
                f"rope mrope_section={params['mrope_section']} must add up to head_dim / 2 = {head_dim // 2}; "
                "the model config is inconsistent"
            )
        row_of_freq = torch.repeat_interleave(torch.arange(3, device=self.cos.device), section.to(self.cos.device))
        self.row_of_column = torch.cat([row_of_freq, row_of_freq])  # (D,): the position row each column reads
        self.columns = torch.arange(head_dim, device=self.cos.device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            return super().forward(positions, q, k)
        index = positions[self.row_of_column].T  # (T, D): the position column c of token t rotates by
        cos, sin = self.cos[index, self.columns], self.sin[index, self.columns]
        return apply_rope(q, k, cos, sin, torch.arange(positions.shape[1], device=positions.device))


def rotary_embedding(head_dim: int, max_positions: int, params: dict[str, Any]) -> RotaryEmbedding:
    """M-RoPE when the RoPE settings have an `mrope_section` (Qwen2-VL & co.), else plain RoPE."""
    if params.get("mrope_section"):
        return MRotaryEmbedding(head_dim, max_positions, params)
    return RotaryEmbedding(head_dim, max_positions, params)
