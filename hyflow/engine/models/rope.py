"""Rotary position embeddings (RoPE) and the scaling variants that Hugging Face configs name.

    inv_freq[i] = 1 / theta^(2i / d)            i = 0 .. d/2-1   (d = rotary dim = head_dim)
    q' = q * cos(p * inv_freq) + rotate_half(q) * sin(p * inv_freq)   (RoFormer, Su et al. 2021)

Variants (`rope_type` in `config.rope_parameters` / `config.rope_scaling`):
- `default`: the formula above.
- `linear`: positions divided by `factor` (Chen et al. 2023, "position interpolation").
- `dynamic`: NTK-aware base `theta * ((factor * L / L0) - (factor - 1))^(d / (d - 2))` for a context `L` beyond the
  original `L0`. Hugging Face recomputes the base per forward from the batch's length; a KV cache cannot, so the
  engine uses the base for its own `max_model_len` (identical to HF while `max_model_len <= L0`), as vLLM does.
- `llama3`: low frequencies divided by `factor`, high ones kept, a smooth ramp between (Llama 3.1 report).
- `yarn`: per-dimension blend of interpolation and extrapolation plus an attention factor (Peng et al. 2023).

Shapes: `positions` (T,), `q` (T, H, D), `k` (T, Hkv, D); the cos/sin cache is (max_positions, D).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from hyflow.engine.models.ops import apply_rope

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """The RoPE settings of a Hugging Face config as one dict (`rope_type`, `rope_theta`, scaling keys).

    transformers 5 keeps them in `config.rope_parameters`; 4.x in `config.rope_theta` + `config.rope_scaling`.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    for key, value in scaling.items():
        params.setdefault(key, value)
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    params["rope_type"] = rope_type
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling.rope_type={rope_type!r} is not supported by the hyflow engine; supported: "
            f"{list(SUPPORTED_ROPE_TYPES)}. Use rollout.name=hf to generate with transformers instead."
        )
    return params


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(params: dict[str, Any], dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    theta = params["rope_theta"]
    old_len = params.get("original_max_position_embeddings") or max_positions
    factor = params.get("factor") or max_positions / old_len

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        if params.get("mscale") and params.get("mscale_all_dim"):
            attention_factor = mscale(factor, params["mscale"]) / mscale(factor, params["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:  # the dimension that turns `rotations` times over `old_len`
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(params.get("beta_fast") or 32), correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    extrapolation = _base_inv_freq(theta, dim)
    interpolation = extrapolation / factor
    inv_freq = interpolation * ramp + extrapolation * (1 - ramp)
    return inv_freq, float(attention_factor)


def compute_inv_freq(params: dict[str, Any], dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (d/2,) and the cos/sin scale for one RoPE variant (see the module docstring)."""
    rope_type, theta = params["rope_type"], params["rope_theta"]
    if rope_type == "yarn":
        return _yarn_inv_freq(params, dim, max_positions)
    if rope_type == "dynamic":
        old_len = params.get("original_max_position_embeddings") or max_positions
        if max_positions > old_len:
            factor = params["factor"]
            theta = theta * ((factor * max_positions / old_len) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = _base_inv_freq(theta, dim)
    if rope_type == "linear":
        inv_freq = inv_freq / params["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, params)
    return inv_freq, 1.0


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k from a cos/sin table precomputed for `max_positions` positions."""

    def __init__(self, head_dim: int, max_positions: int, params: dict[str, Any]) -> None:
        super().__init__()
        inv_freq, scale = compute_inv_freq(params, head_dim, max_positions)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        # Plain attributes, not buffers: `model.to(bfloat16)` must not round the table; it is cast when applied.
        self.cos = emb.cos() * scale
        self.sin = emb.sin() * scale

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rope(q, k, self.cos, self.sin, positions)
