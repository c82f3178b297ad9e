"""The small elementwise ops of the decoder, each compiled into one fused kernel on CUDA (eager on CPU).

A decode step of a 24-layer model otherwise launches ~40 tiny kernels per layer (casts, squares, means, adds,
the halves of RoPE); fused, it is a handful per layer, which is what makes the CUDA-graph decode step short.
The math is exactly the eager math (same formulas, same dtypes), so CPU and CUDA agree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hyflow.engine import triton_kernels


def fused_on_cuda(fn: Callable) -> Callable:
    """Runs `fn` through `torch.compile` (dynamic shapes, compiled on first use) for CUDA tensors."""
    compiled = None

    @functools.wraps(fn)
    def wrapper(x: torch.Tensor, *args, **kwargs):
        nonlocal compiled
        if not x.is_cuda:
            return fn(x, *args, **kwargs)
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True, fullgraph=True)
        return compiled(x, *args, **kwargs)

    return wrapper


@fused_on_cuda
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * weight, normalised in fp32 (Zhang & Sennrich 2019), as HF computes it."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


@fused_on_cuda
def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the residual add fused into the next norm."""
    residual = x + residual
    dtype = residual.dtype
    y = residual.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(dtype), residual


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@fused_on_cuda
def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k (T, heads, D) rotated by their positions: x * cos + rotate_half(x) * sin."""
    cos = cos_table[positions].unsqueeze(1).to(q.dtype)
    sin = sin_table[positions].unsqueeze(1).to(q.dtype)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


@fused_on_cuda
def _silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's inner product: silu(gate) * up, with gate and up the two halves of the fused projection (on CUDA
    with Triton: triton_kernels.silu_and_mul, computed in fp32 and rounded once, as the compiled op does)."""
    if gate_up.is_cuda and triton_kernels.available():
        return triton_kernels.silu_and_mul(gate_up)
    return _silu_and_mul(gate_up)
