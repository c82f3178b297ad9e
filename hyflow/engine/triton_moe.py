"""The fused mixture-of-experts layer on CUDA (Triton): no host sync and fixed shapes, so it runs inside the decode
step's CUDA graphs and the multi-step window, where moe.grouped_experts (eager, it reads the per-expert counts)
cannot.

    align:   the P = T·k (token, expert) pairs, sorted by expert, fill a buffer in which each expert's pairs start on
             a multiple of BLOCK_M (padding rows point past the last pair); block b of BLOCK_M rows belongs to one
             expert, `block_experts[b]` (X for the unused blocks at the end, which return at once)
    gemm 1:  h[p] = silu(x[t] W_gate[e]^T) * (x[t] W_up[e]^T)        pair p = t·k + j routed token t to expert e
    gemm 2:  y[p] = w[p] · h[p] W_down[e]^T                           w[p]: the routing weight of the pair
    combine: out[t] = sum_j y[t·k + j]                               (fp32, then the model's dtype)

Each GEMM program computes a BLOCK_M × BLOCK_N tile of one expert, accumulating in fp32 over BLOCK_K slices of the
reduction (the gate and up tiles side by side in gemm 1, SiLU-and-mul applied to the fp32 accumulators). fp32
weights multiply in IEEE fp32 (no TF32), so fp32 engines match transformers' experts to rounding.

Shapes: T tokens, E hidden, X experts, k experts per token, I an expert's intermediate size (I / tp on a TP rank).
"""

from __future__ import annotations

import torch

from hyflow.engine import triton_kernels

triton, tl = triton_kernels.triton, triton_kernels.tl
available = triton_kernels.available


def launch_config(num_pairs: int, num_experts: int, itemsize: int = 2) -> dict[str, int]:
    """Tile sizes: small row blocks when few pairs reach each expert (decode), larger ones for prefill. From
    benchmarks/moe_kernels.py's sweep on an H100 at the Qwen3-30B-A3B shape (the best of 24 settings at 1, 64,
    256, 2048 and 8192 tokens, bf16; 2-4% over the first guesses). fp32 (`itemsize` 4) halves the reduction tile so
    that three stages of gate, up and input tiles fit the 227 KiB of shared memory of a Hopper SM."""
    if num_pairs <= 4 * num_experts:
        config = {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3}
    elif num_pairs <= 64 * num_experts:
        config = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3}
    else:
        config = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 4}
    if itemsize > 2:  # fp32 tiles take twice the shared memory: (BLOCK_M + 2·BLOCK_N)·BLOCK_K·4 B per stage
        config.update(BLOCK_K=32, num_stages=3)
    return config


def align_pairs(expert_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair of each row (R,) int32 — P for padding rows, expert of each block (R / block_m,) int32 — X for unused
    blocks) with R = (ceil(P / block_m) + X) · block_m rows, enough for any routing. Device ops only."""
    flat = expert_ids.flatten()
    num_pairs, device = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = flat.argsort(stable=True)
    expert_of = flat[order]
    rank = torch.arange(num_pairs, device=device) - (counts.cumsum(0) - counts)[expert_of]
    num_blocks = -(-num_pairs // block_m) + num_experts
    rows = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    rows[(ends - padded)[expert_of] + rank] = order.to(torch.int32)
    starts = torch.arange(num_blocks, device=device) * block_m
    block_experts = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    return rows, block_experts


def fused_experts(
    x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor
) -> torch.Tensor:
    """y (T, E) = sum_j weights[t, j] · w2[e] (silu(gate_e x_t) * up_e x_t), e = expert_ids[t, j]: what
    moe.grouped_experts computes, in two grouped GEMM launches."""
    num_tokens, top_k = expert_ids.shape
    num_experts, two_columns, hidden = w13.shape
    columns = two_columns // 2
    num_pairs = num_tokens * top_k
    config = launch_config(num_pairs, num_experts, x.element_size())
    block_m = config["BLOCK_M"]
    rows, block_experts = align_pairs(expert_ids, num_experts, block_m)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    x = x.contiguous()
    h = torch.empty(num_pairs, columns, dtype=x.dtype, device=x.device)
    grid = (block_experts.numel(), triton.cdiv(columns, config["BLOCK_N"]))
    _gate_up_kernel[grid](
        x, w13, h, rows, block_experts, num_pairs, num_experts, top_k, hidden, columns,
        x.stride(0), w13.stride(0), w13.stride(1), w13.stride(2), h.stride(0),
        PRECISION=precision, **config,
    )  # fmt: skip
    y = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    grid = (block_experts.numel(), triton.cdiv(hidden, config["BLOCK_N"]))
    _down_kernel[grid](
        h, w2, y, rows, block_experts, weights.flatten().float().contiguous(), num_pairs, num_experts, columns,
        hidden, h.stride(0), w2.stride(0), w2.stride(1), w2.stride(2), y.stride(0),
        PRECISION=precision, **config,
    )  # fmt: skip
    return y.view(num_tokens, top_k, hidden).sum(1, dtype=torch.float32).to(x.dtype)


if triton is not None:

    @triton.jit
    def _gate_up_kernel(
        x_ptr, w_ptr, h_ptr, rows_ptr, block_experts_ptr, num_pairs, num_experts, top_k, K, N,
        stride_x, stride_we, stride_wn, stride_wk, stride_h,
        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        """h[p, n] = silu(x[t] · W[e, n]) * (x[t] · W[e, N + n]) for the rows of one block and BLOCK_N columns."""
        block = tl.program_id(0)
        expert = tl.load(block_experts_ptr + block)
        if expert >= num_experts:
            return
        pairs = tl.load(rows_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < num_pairs
        tokens = tl.where(valid, pairs // top_k, 0)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        ks = tl.arange(0, BLOCK_K)
        a_ptrs = x_ptr + tokens[:, None].to(tl.int64) * stride_x + ks[None, :]
        g_ptrs = w_ptr + expert.to(tl.int64) * stride_we + cols[None, :] * stride_wn + ks[:, None] * stride_wk
        u_ptrs = g_ptrs + N * stride_wn
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_ok = ks < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            gate = tl.dot(a, g, gate, input_precision=PRECISION)
            up = tl.dot(a, u, up, input_precision=PRECISION)
            a_ptrs += BLOCK_K
            g_ptrs += BLOCK_K * stride_wk
            u_ptrs += BLOCK_K * stride_wk
        out = gate * tl.sigmoid(gate) * up
        h_ptrs = h_ptr + pairs[:, None].to(tl.int64) * stride_h + cols[None, :]
        tl.store(h_ptrs, out.to(h_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])

    @triton.jit
    def _down_kernel(
        h_ptr, w_ptr, y_ptr, rows_ptr, block_experts_ptr, weights_ptr, num_pairs, num_experts, K, N,
        stride_h, stride_we, stride_wn, stride_wk, stride_y,
        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        """y[p, n] = w[p] · (h[p] · W2[e, n]) for the rows of one block and BLOCK_N hidden columns."""
        block = tl.program_id(0)
        expert = tl.load(block_experts_ptr + block)
        if expert >= num_experts:
            return
        pairs = tl.load(rows_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < num_pairs
        safe = tl.where(valid, pairs, 0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        ks = tl.arange(0, BLOCK_K)
        a_ptrs = h_ptr + safe[:, None] * stride_h + ks[None, :]
        b_ptrs = w_ptr + expert.to(tl.int64) * stride_we + cols[None, :] * stride_wn + ks[:, None] * stride_wk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_ok = ks < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K * stride_wk
        weight = tl.load(weights_ptr + safe, mask=valid, other=0.0)
        acc = acc * weight[:, None]
        y_ptrs = y_ptr + safe[:, None] * stride_y + cols[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])
