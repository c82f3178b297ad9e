"""Triton kernels of the decoder layer's elementwise ops: RMSNorm, SiLU-and-mul and rotary embedding.

Shape legend: n = rows (tokens, or tokens × heads for Qwen3's per-head q/k norm), d = normalised size, m = any
number of elements. All math is in fp32; outputs are in the input's dtype. Only imported where Triton is installed.

    y, rstd = rms_norm_forward(x, weight, eps)                 # x (n, d) → y (n, d), rstd (n,) fp32
    dx, dweight = rms_norm_backward(dy, x, weight, rstd)        # dweight fp32, summed over per-program partials
    out = silu_mul_forward(gate, up)                            # (m,) each
    dgate, dup = silu_mul_backward(dout, gate, up)
    out = rotary(x, cos, sin)                                   # x (B, H, T, D), cos / sin (B, T, D)
    dx = rotary(dout, cos, sin, backward=True)

RMSNorm (Zhang & Sennrich, 2019), with r = 1 / sqrt(mean(x²) + eps) and x̂ = x·r:
    y = x̂ ⊙ w        ∂L/∂x = r · (g − x̂ · mean(g ⊙ x̂)),  g = ∂L/∂y ⊙ w        ∂L/∂w = Σ_rows ∂L/∂y ⊙ x̂
SiLU-and-mul (the SwiGLU MLP's activation, Shazeer 2020), with σ the logistic function:
    out = silu(a) · b = a·σ(a)·b      ∂/∂a = dout · b · σ(a)·(1 + a·(1 − σ(a)))      ∂/∂b = dout · silu(a)
Rotary position embedding (Su et al., 2021, RoFormer), halves x = (x1, x2), c = (c1, c2), s = (s1, s2):
    out = (x1·c1 − x2·s1, x2·c2 + x1·s2)                ∂L/∂x = (g1·c1 + g2·s2, g2·c2 − g1·s1)
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

ELEMENTWISE_BLOCK = 1024
TILE_ELEMENTS = 4096  # elements one RMSNorm program holds at once (rows × padded d)


@triton.jit
def _rms_norm_forward_kernel(
    x_ptr, weight_ptr, y_ptr, rstd_ptr, num_rows, dim, eps, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < num_rows) & (cols[None, :] < dim)
    offsets = rows[:, None] * dim + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=cols < dim, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / dim + eps)
    y = x * rstd[:, None] * weight[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=rows < num_rows)


@triton.jit
def _rms_norm_backward_kernel(
    dy_ptr,
    x_ptr,
    weight_ptr,
    rstd_ptr,
    dx_ptr,
    dweight_partial_ptr,
    num_rows,
    dim,
    rows_per_program,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < dim
    weight = tl.load(weight_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dweight = tl.zeros([BLOCK_D], dtype=tl.float32)
    first_row = program.to(tl.int64) * rows_per_program
    for start in range(0, rows_per_program, BLOCK_R):
        rows = first_row + start + tl.arange(0, BLOCK_R)
        row_mask = (rows < num_rows) & (start + tl.arange(0, BLOCK_R) < rows_per_program)
        mask = row_mask[:, None] & col_mask[None, :]
        offsets = rows[:, None] * dim + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        x_hat = x * rstd[:, None]
        g = dy * weight[None, :]
        dx = rstd[:, None] * (g - x_hat * (tl.sum(g * x_hat, axis=1) / dim)[:, None])
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dweight += tl.sum(dy * x_hat, axis=0)
    tl.store(dweight_partial_ptr + program * dim + cols, dweight, mask=col_mask)


def _rms_norm_tile(dim: int) -> tuple[int, int]:
    block_d = triton.next_power_of_2(dim)
    return max(1, TILE_ELEMENTS // block_d), block_d


def _num_programs(device: torch.device) -> int:
    """Programs for a reduction over rows: a few per streaming multiprocessor (a small fixed number on CPU)."""
    if device.type == "cuda":
        return 4 * _multi_processor_count(device.index if device.index is not None else torch.cuda.current_device())
    return 4


@functools.cache
def _multi_processor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x / sqrt(mean(x²) + eps) ⊙ w over the last dim of a contiguous (n, d) `x`; also r per row (fp32)."""
    num_rows, dim = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(num_rows, dtype=torch.float32, device=x.device)
    block_r, block_d = _rms_norm_tile(dim)
    if num_rows:
        grid = (triton.cdiv(num_rows, block_r),)
        _rms_norm_forward_kernel[grid](
            x, weight, y, rstd, num_rows, dim, eps, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=8
        )
    return y, rstd


def rms_norm_backward(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(∂L/∂x in x's dtype, ∂L/∂w in fp32): each program sums its rows' ∂L/∂w in fp32, then torch sums those."""
    num_rows, dim = x.shape
    dx = torch.empty_like(x)
    block_r, block_d = _rms_norm_tile(dim)
    programs = max(1, min(_num_programs(x.device), triton.cdiv(num_rows, block_r)))
    rows_per_program = triton.cdiv(num_rows, programs)
    dweight_partial = torch.zeros(programs, dim, dtype=torch.float32, device=x.device)
    if num_rows:
        _rms_norm_backward_kernel[(programs,)](
            dy,
            x,
            weight,
            rstd,
            dx,
            dweight_partial,
            num_rows,
            dim,
            rows_per_program,
            BLOCK_R=block_r,
            BLOCK_D=block_d,
            num_warps=8,
        )
    return dx, dweight_partial.sum(dim=0)


@triton.jit
def _silu_mul_forward_kernel(gate_ptr, up_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    a = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    out = a * tl.sigmoid(a) * b
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_backward_kernel(dout_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, numel, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    dout = tl.load(dout_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    sigmoid = tl.sigmoid(a)
    dgate = dout * b * sigmoid * (1.0 + a * (1.0 - sigmoid))
    tl.store(dgate_ptr + offsets, dgate.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + offsets, (dout * a * sigmoid).to(dup_ptr.dtype.element_ty), mask=mask)


def silu_mul_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up, elementwise over two contiguous tensors of the same shape, in gate's dtype."""
    out = torch.empty_like(gate)
    numel = gate.numel()
    if numel:
        grid = (triton.cdiv(numel, ELEMENTWISE_BLOCK),)
        _silu_mul_forward_kernel[grid](gate, up, out, numel, BLOCK=ELEMENTWISE_BLOCK)
    return out


def silu_mul_backward(dout: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(∂L/∂gate, ∂L/∂up) of silu(gate) · up, in the inputs' dtypes."""
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    numel = gate.numel()
    if numel:
        grid = (triton.cdiv(numel, ELEMENTWISE_BLOCK),)
        _silu_mul_backward_kernel[grid](dout, gate, up, dgate, dup, numel, BLOCK=ELEMENTWISE_BLOCK)
    return dgate, dup


@triton.jit
def _rotary_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    num_heads,
    seq_len,
    half,
    stride_xb,
    stride_xh,
    stride_xt,
    stride_ob,
    stride_oh,
    stride_ot,
    stride_cb,
    stride_ct,
    BACKWARD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """One program per (batch, position): all heads of x (B, H, T, D) at once, cos / sin (B, T, D) read once."""
    pid = tl.program_id(0).to(tl.int64)
    b, t = pid // seq_len, pid % seq_len
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    col_mask = cols < half
    mask = (heads[:, None] < num_heads) & col_mask[None, :]
    cs_row = b * stride_cb + t * stride_ct
    c1 = tl.load(cos_ptr + cs_row + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + cs_row + half + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + cs_row + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + cs_row + half + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    x_row = b * stride_xb + t * stride_xt + heads[:, None] * stride_xh
    x1 = tl.load(x_ptr + x_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_row + half + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:  # the transpose of the rotation: dx1 = dy1·c1 + dy2·s2, dx2 = dy2·c2 − dy1·s1
        out1 = x1 * c1 + x2 * s2
        out2 = x2 * c2 - x1 * s1
    else:  # x·cos + rotate_half(x)·sin with rotate_half(x) = (−x2, x1)
        out1 = x1 * c1 - x2 * s1
        out2 = x2 * c2 + x1 * s2
    out_row = b * stride_ob + t * stride_ot + heads[:, None] * stride_oh
    tl.store(out_ptr + out_row + cols[None, :], out1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + out_row + half + cols[None, :], out2.to(out_ptr.dtype.element_ty), mask=mask)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool = False) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin (or, with `backward`, its transpose applied to a gradient) for x (B, H, T, D)
    of any strides with a unit last stride, cos / sin broadcastable to (B, T, D); output laid out like x."""
    batch, num_heads, seq_len, head_dim = x.shape
    cos, sin = cos.expand(batch, seq_len, head_dim), sin.expand(batch, seq_len, head_dim)
    assert x.stride(-1) == 1 and cos.stride(-1) == 1 and cos.stride() == sin.stride()
    out = torch.empty_like(x)
    if x.numel():
        _rotary_kernel[(batch * seq_len,)](
            x,
            cos,
            sin,
            out,
            num_heads,
            seq_len,
            head_dim // 2,
            *x.stride()[:3],
            *out.stride()[:3],
            *cos.stride()[:2],
            BACKWARD=backward,
            BLOCK_H=triton.next_power_of_2(num_heads),
            BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        )
    return out
