"""Triton kernels of the LM head's log-prob step: one pass over a chunk's logits forward, one backward.

Shape legend: n = positions in the chunk, V = vocabulary. `logits` is the (n, V) output of the LM head's matmul in
the compute dtype (bf16 under FSDP2), before temperature; every kernel divides by the temperature as it reads.

    log_probs, log_normalizers, entropy = logits_stats(logits, labels, temperature, compute_entropy)
    grad_logits_(logits, labels, log_normalizers, entropy, grad_log_probs, grad_entropy, temperature, use_entropy)

With z = logits / T and p = softmax(z), the forward kernel reads each row once and keeps, in fp32, the running
max m, s = Σ exp(z − m) and (for the entropy) t = Σ exp(z − m)·z, rescaling both by exp(m_old − m_new) when the
max grows (the online softmax of Milakov & Gimelshein, 2018):
    logsumexp(z) = m + log s        log p(y) = z_y − logsumexp(z)        H = logsumexp(z) − t / s
The backward kernel overwrites the logits buffer in place with
    ∂L/∂logits = [(onehot(y) − p)·g_lp − g_H·p·(log p + H)] / T
in the buffer's dtype, so the two matmuls that follow read it directly. Only imported where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BLOCK_V = 4096  # vocabulary entries one program reads per step (16 fp32 values per thread with 8 warps)


@triton.jit
def _logits_stats_kernel(
    logits_ptr,
    labels_ptr,
    log_probs_ptr,
    log_normalizers_ptr,
    entropy_ptr,
    vocab_size,
    row_stride,
    inv_temperature,
    COMPUTE_ENTROPY: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    running_max = -float("inf")
    sum_exp = 0.0
    sum_exp_z = 0.0
    for start in range(0, vocab_size, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = cols < vocab_size
        z = tl.load(row_ptr + cols, mask=mask, other=-float("inf")).to(tl.float32) * inv_temperature
        new_max = tl.maximum(running_max, tl.max(z, axis=0))
        rescale = tl.exp(running_max - new_max)
        weights = tl.exp(z - new_max)  # 0 on masked lanes
        sum_exp = sum_exp * rescale + tl.sum(weights, axis=0)
        if COMPUTE_ENTROPY:
            sum_exp_z = sum_exp_z * rescale + tl.sum(weights * tl.where(mask, z, 0.0), axis=0)
        running_max = new_max
    log_normalizer = running_max + tl.log(sum_exp)
    label = tl.load(labels_ptr + row).to(tl.int64)
    label_z = tl.load(row_ptr + label).to(tl.float32) * inv_temperature
    tl.store(log_probs_ptr + row, label_z - log_normalizer)
    tl.store(log_normalizers_ptr + row, log_normalizer)
    if COMPUTE_ENTROPY:
        tl.store(entropy_ptr + row, log_normalizer - sum_exp_z / sum_exp)


@triton.jit
def _grad_logits_kernel(
    logits_ptr,
    labels_ptr,
    log_normalizers_ptr,
    entropy_ptr,
    grad_log_probs_ptr,
    grad_entropy_ptr,
    vocab_size,
    row_stride,
    inv_temperature,
    USE_ENTROPY: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    label = tl.load(labels_ptr + row).to(tl.int64)
    log_normalizer = tl.load(log_normalizers_ptr + row)
    g_lp = tl.load(grad_log_probs_ptr + row).to(tl.float32)
    if USE_ENTROPY:
        entropy = tl.load(entropy_ptr + row)
        g_h = tl.load(grad_entropy_ptr + row).to(tl.float32)
    for start in range(0, vocab_size, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = cols < vocab_size
        z = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32) * inv_temperature
        log_p = z - log_normalizer
        p = tl.exp(log_p)
        if USE_ENTROPY:
            grad = -p * (g_lp + g_h * (log_p + entropy))
        else:
            grad = -p * g_lp
        grad = tl.where(cols == label, grad + g_lp, grad) * inv_temperature
        tl.store(row_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=mask)


def _block_v(vocab_size: int) -> int:
    return min(MAX_BLOCK_V, triton.next_power_of_2(vocab_size))


def logits_stats(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, compute_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log p(y), logsumexp(z), H) per row of `logits` (n, V), z = logits / T, in fp32; H is 0 unless asked."""
    assert logits.stride(-1) == 1, "the kernel reads rows of contiguous vocabulary entries"
    rows, vocab_size = logits.shape
    log_probs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    log_normalizers = torch.empty_like(log_probs)
    entropy = torch.zeros_like(log_probs)
    if rows:
        _logits_stats_kernel[(rows,)](
            logits,
            labels,
            log_probs,
            log_normalizers,
            entropy,
            vocab_size,
            logits.stride(0),
            1.0 / temperature,
            COMPUTE_ENTROPY=compute_entropy,
            BLOCK_V=_block_v(vocab_size),
            num_warps=8,
        )
    return log_probs, log_normalizers, entropy


def grad_logits_(
    logits: torch.Tensor,
    labels: torch.Tensor,
    log_normalizers: torch.Tensor,
    entropy: torch.Tensor,
    grad_log_probs: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    temperature: float,
    use_entropy: bool,
) -> torch.Tensor:
    """Overwrite `logits` (n, V) with ∂L/∂logits (see the module docstring) and return it."""
    assert logits.stride(-1) == 1, "the kernel reads rows of contiguous vocabulary entries"
    rows, vocab_size = logits.shape
    if rows:
        _grad_logits_kernel[(rows,)](
            logits,
            labels,
            log_normalizers,
            entropy,
            grad_log_probs.contiguous(),
            grad_entropy.contiguous() if use_entropy else grad_log_probs,
            vocab_size,
            logits.stride(0),
            1.0 / temperature,
            USE_ENTROPY=use_entropy,
            BLOCK_V=_block_v(vocab_size),
            num_warps=8,
        )
    return logits
