"""Triton kernels for the CUDA fast path: decode attention straight from the paged KV cache, a fused sampler, and
SwiGLU's silu(gate) * up.

Both compute exactly what the PyTorch code next to them computes on CPU (attention.py, sampler.py), without the
intermediate tensors: the decode kernel reads each sequence's K/V blocks in place (no gather copy), and the sampler
reads the logits once to produce the sampled token and the log-sum-exps (no (B, V) noise or log-softmax tensors).
`available()` says whether Triton and a CUDA device are there; otherwise callers use the PyTorch code.

Shapes: B sequences, H query heads, Hkv KV heads, G = H / Hkv, D head dim, V vocabulary.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # CPU-only installs: the PyTorch paths run instead (triton_rope and triton_step import these)
    triton = tl = libdevice = None


SAMPLE_BLOCK = 2048  # logits per loop iteration of a sampler program
SPLIT_SIZE = 8 * SAMPLE_BLOCK  # logits per sampler program: 152k vocabulary → 10 programs per row
# Decode attention: keys per loop iteration and the launch, from benchmarks/decode_kernels.py's sweep on an H200
# (1.29x / 1.34x the former 64 keys, 3 stages at 64 / 256 sequences).
DECODE_LAUNCH = {"block_n": 128, "num_warps": 4, "num_stages": 2}


@functools.cache
def available() -> bool:
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _hash32(x):
        """lowbias32 on uint32 (wrapping multiplies), identical to sampler._hash32."""
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x1B873593
        return x ^ (x >> 16)

    @triton.jit
    def _sample_kernel(
        logits_ptr,
        stride,
        temps_ptr,
        seeds_ptr,
        counters_ptr,
        keys_ptr,
        tokens_ptr,
        max_ptr,
        sum_ptr,
        raw_max_ptr,
        raw_sum_ptr,
        vocab_size,
        split_size,
        BLOCK: tl.constexpr,
        NEED_RAW: tl.constexpr,
        FAST_LOG: tl.constexpr,
    ):
        """One (row, vocabulary split) per program; writes the split's best Gumbel key and its token, and the
        running max / sum of exp of logits / T and (NEED_RAW) of the raw logits (combined over splits in
        fused_sample). The kernel is bound by its arithmetic, not by reading the logits, so it spends as few
        instructions per logit as it can: logits / T as one multiply by 1 / T, and (FAST_LOG) the noise's outer
        log as lg2.approx (absolute error ~2^-22 on log E, E = -log u in (3e-8, 17)). The inner log stays exact:
        near u = 1, where the winning keys are, lg2.approx's absolute error is larger than log u itself."""
        row = tl.program_id(0)
        split = tl.program_id(1)
        out = row * tl.num_programs(1) + split
        temp = tl.load(temps_ptr + row)
        greedy = temp == 0.0
        inverse = 1.0 / tl.where(greedy, 1.0, temp)
        seed = (tl.load(seeds_ptr + row) & 0xFFFFFFFF).to(tl.uint32)
        counter = (tl.load(counters_ptr + row) & 0xFFFFFFFF).to(tl.uint32)
        row_hash = _hash32(_hash32(seed) ^ counter)
        best_key, best_index = -float("inf"), 0
        m, s, raw_m, raw_s = -1e30, 0.0, -1e30, 0.0
        split_start = split * split_size
        split_end = tl.minimum(split_start + split_size, vocab_size)
        for start in range(split_start, split_end, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            valid = cols < split_end
            z = tl.load(logits_ptr + row * stride + cols, mask=valid, other=-float("inf")).to(tl.float32)
            scaled = z * inverse
            mix = (cols.to(tl.uint64) * 0x9E3779B1).to(tl.uint32)
            bits = _hash32(_hash32(row_hash ^ mix))
            uniform = ((bits >> 8).to(tl.float32) + 0.5) / 16777216.0
            exponential = -tl.log(uniform)
            if FAST_LOG:
                noise = -libdevice.fast_logf(exponential)
            else:
                noise = -tl.log(exponential)
            key = tl.where(greedy, z, scaled + noise)
            key = tl.where(valid, key, -float("inf"))
            block_best = tl.max(key, 0)
            if block_best > best_key:
                best_key, best_index = block_best, start + tl.argmax(key, 0)
            new_m = tl.maximum(m, tl.max(scaled, 0))
            s = s * tl.exp(m - new_m) + tl.sum(tl.where(valid, tl.exp(scaled - new_m), 0.0), 0)
            m = new_m
            if NEED_RAW:
                new_raw_m = tl.maximum(raw_m, tl.max(z, 0))
                raw_s = raw_s * tl.exp(raw_m - new_raw_m) + tl.sum(tl.where(valid, tl.exp(z - new_raw_m), 0.0), 0)
                raw_m = new_raw_m
        tl.store(keys_ptr + out, best_key)
        tl.store(tokens_ptr + out, best_index)
        tl.store(max_ptr + out, m)
        tl.store(sum_ptr + out, s)
        if NEED_RAW:
            tl.store(raw_max_ptr + out, raw_m)
            tl.store(raw_sum_ptr + out, raw_s)

    @triton.jit
    def _decode_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        out_ptr,
        tables_ptr,
        pos_ptr,
        q_stride,
        k_stride_block,
        k_stride_slot,
        table_stride,
        out_stride,
        scale,
        WINDOW: tl.constexpr,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        DIM_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_N: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        b, kv_head = tl.program_id(0), tl.program_id(1)
        pos = tl.load(pos_ptr + b)
        g, d = tl.arange(0, GROUP_PAD), tl.arange(0, DIM_PAD)
        head_ok, dim_ok = g < GROUP, d < HEAD_DIM
        heads = kv_head * GROUP + g
        q_mask = head_ok[:, None] & dim_ok[None, :]
        q = tl.load(q_ptr + b * q_stride + heads[:, None] * HEAD_DIM + d[None, :], mask=q_mask, other=0.0)
        m_i = tl.full([GROUP_PAD], -1e30, tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
        low = pos * 0  # int64, like pos
        if WINDOW > 0:
            low = tl.maximum(pos - WINDOW + 1, 0)
        for start in range(low, pos + 1, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            valid = n <= pos
            block = tl.load(tables_ptr + b * table_stride + n // BLOCK_SIZE, mask=valid, other=0)
            offsets = block.to(tl.int64) * k_stride_block + (n % BLOCK_SIZE) * k_stride_slot + kv_head * HEAD_DIM
            kv_mask = valid[:, None] & dim_ok[None, :]
            k = tl.load(k_ptr + offsets[:, None] + d[None, :], mask=kv_mask, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            scores = tl.where(valid[None, :], scores, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            v = tl.load(v_ptr + offsets[:, None] + d[None, :], mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(out_ptr + b * out_stride + heads[:, None] * HEAD_DIM + d[None, :], out.to(q.dtype), mask=q_mask)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int | None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Attention of one new query per sequence (B, H, D) over its cached context (positions 0..pos); (B, H, D).
    `block_n` (keys per loop iteration), `num_warps`, `num_stages`: None takes `DECODE_LAUNCH`'s (the benchmark
    benchmarks/decode_kernels.py sweeps them)."""
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    q = q.contiguous()
    out = torch.empty_like(q)
    _decode_attention_kernel[(batch, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        positions,
        q.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        block_tables.stride(0),
        out.stride(0),
        scale,
        WINDOW=window or 0,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n or DECODE_LAUNCH["block_n"],
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps or DECODE_LAUNCH["num_warps"],
        num_stages=num_stages or DECODE_LAUNCH["num_stages"],
    )
    return out


if triton is not None:

    @triton.jit
    def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, half, BLOCK: tl.constexpr):
        """One (row, column block) per program: out[r, c] = silu(x[r, c]) * x[r, half + c], in fp32."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < half
        gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * x_stride + half + cols, mask=mask, other=0.0).to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


SILU_BLOCK = 1024  # columns per program


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for `gate_up` (..., 2I) = [gate | up]; (..., I). A 2-D grid (rows x column blocks) with no
    index division: torch.compile's dynamic-shape kernel for the same op ran at ~1.3 TB/s on an H200 (its flat
    index is divided by the symbolic width per element), a third of the card's bandwidth. (The training side's
    `hyflow.models.kernels.triton_norm_act.silu_mul_forward` takes two contiguous tensors; here both halves sit in
    each row of the fused projection's output and are read in place, and the engine imports nothing from training.)"""
    width = gate_up.shape[-1]
    half = width // 2
    x = gate_up.reshape(-1, width)
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape[0], half, dtype=gate_up.dtype, device=gate_up.device)
    if x.shape[0]:
        _silu_and_mul_kernel[(x.shape[0], triton.cdiv(half, SILU_BLOCK))](
            x, out, x.stride(0), out.stride(0), half, BLOCK=SILU_BLOCK, num_warps=4
        )
    return out.view(*gate_up.shape[:-1], half)


class SamplePartials(NamedTuple):
    """Per (row, vocabulary split) results of the sampler kernel, each (B, splits): the best Gumbel key and its
    token, and the running max / sum of exp of logits / T and of the raw logits."""

    keys: torch.Tensor
    tokens: torch.Tensor
    maxes: torch.Tensor
    sums: torch.Tensor
    raw_maxes: torch.Tensor
    raw_sums: torch.Tensor


def sample_partials(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    need_raw: bool = True,
    fast_log: bool = True,
) -> SamplePartials:
    """The sampler kernel over `logits` (B, V) cut into splits of SPLIT_SIZE, so that B × splits programs fill the
    device even at small B; `fused_sample` (or triton_step.finish_step) combines the splits. Without `need_raw`
    the raw partials are left unwritten (one exp per logit less). `fast_log=False`: both of the noise's logs
    exact (benchmarks/decode_kernels.py's comparison)."""
    batch, vocab_size = logits.shape
    splits = triton.cdiv(vocab_size, SPLIT_SIZE)
    keys = torch.empty(batch, splits, dtype=torch.float32, device=logits.device)
    tokens = torch.empty(batch, splits, dtype=torch.int64, device=logits.device)
    maxes, sums, raw_maxes, raw_sums = torch.empty(4, batch, splits, dtype=torch.float32, device=logits.device)
    _sample_kernel[(batch, splits)](
        logits, logits.stride(0), temperatures, seeds, counters, keys, tokens, maxes, sums, raw_maxes, raw_sums,
        vocab_size, SPLIT_SIZE, BLOCK=SAMPLE_BLOCK, NEED_RAW=need_raw, FAST_LOG=fast_log,
    )  # fmt: skip
    return SamplePartials(keys, tokens, maxes, sums, raw_maxes, raw_sums)


def fused_sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    need_raw: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(tokens (B,), logsumexp of logits / T (B,), logsumexp of logits (B,) or None without `need_raw`) with
    sampler.py's Gumbel noise.

    The splits of `sample_partials` are combined here: the token of the largest key (the first split on ties, as
    one pass would pick), and logsumexp = M + log Σ s_i · exp(m_i − M) over the splits' running (m_i, s_i),
    M = max m_i.
    """
    part = sample_partials(logits, temperatures, seeds, counters, need_raw)
    best = part.keys.argmax(dim=1, keepdim=True)
    raw_lse = _combine_lse(part.raw_maxes, part.raw_sums) if need_raw else None
    return part.tokens.gather(1, best).squeeze(1), _combine_lse(part.maxes, part.sums), raw_lse


def _combine_lse(maxes: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    top = maxes.max(dim=1, keepdim=True).values
    return top.squeeze(1) + (sums * (maxes - top).exp()).sum(dim=1).log()
