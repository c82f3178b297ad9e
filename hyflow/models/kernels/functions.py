"""The fused decoder-layer ops as autograd functions: RMSNorm, SiLU-and-mul and rotary embedding.

    y = rms_norm(x, weight, eps)            # over the last dim; any leading shape; y in x's dtype
    h = silu_mul(gate, up)                  # silu(gate) · up, the SwiGLU MLP's activation
    q = rotary(q, cos, sin)                 # q (B, H, T, D), cos / sin (B, T, D): q·cos + rotate_half(q)·sin

Each op computes in fp32 and writes its output in the input's dtype, in one pass forward and one backward: Triton
kernels on CUDA (`triton_norm_act.py`), and on CPU the torch reference below, which is the same formula written
with torch ops (and what the kernels are tested against). Compared with Hugging Face's modules, which chain
upcast, pow, mean, rsqrt, mul and downcast (RMSNorm), silu then mul (MLP), or mul, slice, neg, cat, mul, add
(rotary) as separate kernels that autograd each saves inputs for, each op here reads its inputs once and saves
only its inputs (plus one fp32 per row for RMSNorm).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hyflow.models.kernels.dispatch import use_triton


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x·r ⊙ w with r = 1 / sqrt(mean(x²) + eps) per row, in fp32; returns (y in x's dtype, r)."""
    x32 = x.float()
    rstd = torch.rsqrt(x32.pow(2).mean(dim=-1) + eps)
    return (x32 * rstd[:, None] * weight.float()).to(x.dtype), rstd


def rms_norm_backward_reference(dy, x, weight, rstd) -> tuple[torch.Tensor, torch.Tensor]:
    """∂L/∂x = r · (g − x̂ · mean(g ⊙ x̂)) with g = dy ⊙ w, x̂ = x·r;  ∂L/∂w = Σ_rows dy ⊙ x̂ (fp32)."""
    dy32 = dy.float()
    x_hat = x.float() * rstd[:, None]
    g = dy32 * weight.float()
    dx = rstd[:, None] * (g - x_hat * (g * x_hat).mean(dim=-1, keepdim=True))
    return dx.to(x.dtype), (dy32 * x_hat).sum(dim=0)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        shape = x.shape
        x = x.reshape(-1, shape[-1]).contiguous()
        if use_triton(x):
            from hyflow.models.kernels import triton_norm_act

            y, rstd = triton_norm_act.rms_norm_forward(x, weight.contiguous(), eps)
        else:
            y, rstd = rms_norm_reference(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.shape = shape
        return y.reshape(shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dy = dy.reshape(x.shape).contiguous()
        if use_triton(x):
            from hyflow.models.kernels import triton_norm_act

            dx, dweight = triton_norm_act.rms_norm_backward(dy, x, weight.contiguous(), rstd)
        else:
            dx, dweight = rms_norm_backward_reference(dy, x, weight, rstd)
        return dx.reshape(ctx.shape), dweight.to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of `x` (any leading shape) with a (d,) `weight`; fp32 math, output in x's dtype.

    y = x / sqrt(mean(x²) + eps) ⊙ w   (Zhang & Sennrich, 2019, "Root Mean Square Layer Normalization")
    """
    return _RMSNorm.apply(x, weight, eps)


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up in fp32, returned in gate's dtype."""
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


def silu_mul_backward_reference(dout, gate, up) -> tuple[torch.Tensor, torch.Tensor]:
    """∂/∂gate = dout · up · σ(gate)·(1 + gate·(1 − σ(gate))),  ∂/∂up = dout · silu(gate)."""
    dout32, a, b = dout.float(), gate.float(), up.float()
    sigmoid = torch.sigmoid(a)
    dgate = dout32 * b * sigmoid * (1 + a * (1 - sigmoid))
    return dgate.to(gate.dtype), (dout32 * a * sigmoid).to(up.dtype)


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        gate, up = gate.contiguous(), up.contiguous()
        if use_triton(gate):
            from hyflow.models.kernels import triton_norm_act

            out = triton_norm_act.silu_mul_forward(gate, up)
        else:
            out = silu_mul_reference(gate, up)
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    def backward(ctx, dout):
        gate, up = ctx.saved_tensors
        dout = dout.contiguous()
        if use_triton(gate):
            from hyflow.models.kernels import triton_norm_act

            return triton_norm_act.silu_mul_backward(dout, gate, up)
        return silu_mul_backward_reference(dout, gate, up)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up = gate·σ(gate)·up elementwise (the SwiGLU activation; Shazeer 2020, "GLU Variants Improve
    Transformer"); fp32 math, output in gate's dtype. `gate` and `up` have the same shape and dtype."""
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(
            f"silu_mul needs gate and up of one shape and dtype, got {tuple(gate.shape)} {gate.dtype} and "
            f"{tuple(up.shape)} {up.dtype}; pass the outputs of gate_proj and up_proj of the same input."
        )
    return _SiluMul.apply(gate, up)


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool = False) -> torch.Tensor:
    """x (B, H, T, D) rotated by cos / sin (B, T, D) in fp32, in x's dtype: with halves x = (x1, x2),
    (x1·c1 − x2·s1, x2·c2 + x1·s2) = x·cos + rotate_half(x)·sin; `backward`: the transpose,
    (x1·c1 + x2·s2, x2·c2 − x1·s1), which maps ∂L/∂out to ∂L/∂x."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c1, c2 = cos.float().unsqueeze(1).chunk(2, dim=-1)
    s1, s2 = sin.float().unsqueeze(1).chunk(2, dim=-1)
    if backward:
        return torch.cat((x1 * c1 + x2 * s2, x2 * c2 - x1 * s1), dim=-1).to(x.dtype)
    return torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), dim=-1).to(x.dtype)


def _rotary_any(x, cos, sin, backward: bool) -> torch.Tensor:
    if use_triton(x) and x.stride(-1) == 1:
        from hyflow.models.kernels import triton_norm_act

        return triton_norm_act.rotary(x, cos.contiguous(), sin.contiguous(), backward)
    return rotary_reference(x, cos, sin, backward)


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotary_any(x, cos, sin, backward=False)

    @staticmethod
    def backward(ctx, grad_out):
        cos, sin = ctx.saved_tensors
        return _rotary_any(grad_out, cos, sin, backward=True), None, None


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x (B, H, T, D) with cos / sin (B or 1, T, D), as Hugging Face's
    `apply_rotary_pos_emb` computes it: x·cos + rotate_half(x)·sin, rotate_half(x) = (−x2, x1) (Su et al., 2021,
    "RoFormer"). fp32 math, output in x's dtype; cos and sin are constants (no gradient flows to them)."""
    return _Rotary.apply(x, cos, sin)
