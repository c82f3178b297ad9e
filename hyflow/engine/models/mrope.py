"""Multimodal rotary positions (M-RoPE, Qwen2-VL): three position rows (temporal, height, width) per token.

Positions of a prompt of P tokens (`mrope_positions`), with s the position after everything before:

    text token:                      (s, s, s),  then s += 1
    image or video k, grid (t, h, w) patches, merge size m: its t*(h/m)*(w/m) pad tokens, in raster order over
                                     (ti, hi, wi): (s + floor(ti * step_k), s + hi, s + wi),  then s += max(h/m, w/m)

step_k is 1 for images and for Qwen2-VL's videos (the temporal row counts temporal patches); Qwen2.5-VL spaces a
video's temporal patches by time, step_k = tokens_per_second * second_per_grid_ts[k] (seconds per temporal patch:
temporal_patch_size / fps), computed in float32 and floored as transformers' `get_rope_index` does.

Every generated token (index i >= P) gets i + delta on all three rows, delta = s_end - P, s_end the s after the
prompt's last token: the response continues as text after the prompt does in a forward over prompt + response (the
positions the training batch holds, and those a later turn's prefill of the whole conversation computes). For a
prompt that ends in text this is one past its last position, and one past its largest too unless a video's temporal
positions reach beyond the text after it (a long Qwen2.5-VL clip), where transformers' `generate` (`rope_deltas`)
and vLLM continue one past the largest instead. With all three rows equal, M-RoPE is plain RoPE at that position,
so decode steps (and their CUDA graphs) run the text path with positions shifted by each sequence's delta; only
prefills of image prompts read three rows.

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
    token_ids: list[int],
    grids: dict[int, list[tuple[int, int, int]]],
    merge_size: int,
    time_steps: dict[int, list[float]] | None = None,
) -> tuple[torch.Tensor, int]:
    """(positions (3, P), delta) of one prompt (see the module docstring). `grids`: per pad token id (the image
    pad's, the video pad's) the grids of its blocks in prompt order; block k of pad id p takes the next
    t*h*w / merge_size^2 tokens of id p. `time_steps`: per pad id, each block's temporal step (default 1). The
    caller checks that the counts add up."""
    rows: list[torch.Tensor] = []
    next_pos, i = 0, 0
    blocks = {pad: iter(pad_grids) for pad, pad_grids in grids.items()}
    steps = {pad: iter((time_steps or {}).get(pad) or [1.0] * len(pad_grids)) for pad, pad_grids in grids.items()}
    while i < len(token_ids):
        pad = token_ids[i]
        if pad not in blocks:
            j = i
            while j < len(token_ids) and token_ids[j] not in blocks:
                j += 1
            rows.append(torch.arange(next_pos, next_pos + j - i).expand(3, -1))
            next_pos, i = next_pos + j - i, j
            continue
        t, h, w = next(blocks[pad])
        h, w = h // merge_size, w // merge_size
        temporal = (torch.arange(t) * torch.tensor(next(steps[pad]), dtype=torch.float32)).long()
        grid = torch.meshgrid(temporal, torch.arange(h), torch.arange(w), indexing="ij")
        rows.append(torch.stack(grid).reshape(3, -1) + next_pos)
        next_pos, i = next_pos + max(h, w), i + t * h * w  # as transformers' get_rope_index, whatever t is
    return torch.cat(rows, dim=1), next_pos - len(token_ids)


def video_time_steps(tokens_per_second: float | None, second_per_grid_ts: Any, num_videos: int) -> list[float] | None:
    """Each video's temporal step, tokens_per_second * second_per_grid_ts in float32 as transformers computes it
    (1 s per temporal patch where `second_per_grid_ts` is None, transformers' default); None without
    `tokens_per_second` (Qwen2-VL: the step is 1)."""
    if tokens_per_second is None:
        return None
    if second_per_grid_ts is None:
        seconds = torch.ones(num_videos)
    else:
        seconds = torch.as_tensor(second_per_grid_ts, dtype=torch.float32).view(-1)
    return (tokens_per_second * seconds).tolist()


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
