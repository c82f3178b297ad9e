"""Token sampling for a batch of sequences, each with its own temperature, top-k, top-p and seed.

For row b with logits z (V,):
    greedy (temperature 0):  token = argmax z
    otherwise:               p = softmax(filter_top_k_top_p(z / T)),   token ~ p   (Gumbel-max: argmax log p + g)
    log_prob    = log p[token]               (the distribution actually sampled from; log_softmax(z) when greedy)
    raw_log_prob = log_softmax(z)[token]     (the model's own distribution)
    top alternatives = topk(log p, k)        (when a row asks for them: `top_alternatives`)

Randomness is counter-based: the Gumbel noise g[v] is a hash of (sequence seed, output token index, v), so a
sequence draws the same numbers whatever else is in the batch, after a preemption, and on any device. The uniform
has 24 bits, so tokens with probability below ~1e-7 relative to the best one are never drawn.
On CUDA without top-k/top-p, one Triton kernel does all of this in a single pass (triton_kernels.fused_sample).
Shapes: B sequences, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hyflow.engine import triton_kernels

_MASK32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix (lowbias32-style) on int64 tensors holding values in [0, 2^32); multipliers < 2^31
    keep every product below 2^63, so nothing overflows."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x1B873593) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise(seeds: torch.Tensor, counters: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise (B, V) that depends only on each row's (seed, counter) and the vocabulary index."""
    row = _hash32(_hash32(seeds & _MASK32) ^ (counters & _MASK32))  # (B,)
    cols = (torch.arange(vocab_size, device=seeds.device, dtype=torch.int64) * 0x9E3779B1) & _MASK32
    bits = _hash32(_hash32(row.unsqueeze(1) ^ cols))
    uniform = ((bits >> 8).float() + 0.5) / float(1 << 24)  # in (0, 1), 24 bits
    return -torch.log(-torch.log(uniform))


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Sets to -inf the logits outside each row's top-k and outside the smallest set of mass >= top-p.

    top_k (B,) long (<= 0: off), top_p (B,) float (1: off). The most likely token is always kept.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    k = torch.where(top_k > 0, top_k, logits.shape[-1]).unsqueeze(1)
    drop = rank >= k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop = drop | (mass_before >= top_p.unsqueeze(1))
    drop[:, 0] = False
    return logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))


@dataclass
class SamplingTensors:
    """Per-row sampling settings of one step, on the logits' device."""

    temperatures: torch.Tensor  # (B,) float, 0 = greedy
    top_k: torch.Tensor  # (B,) long
    top_p: torch.Tensor  # (B,) float
    seeds: torch.Tensor  # (B,) int64
    counters: torch.Tensor  # (B,) int64: index of the token being sampled within its sequence's output
    need_filter: bool  # any row with top-k or top-p on
    need_raw: bool  # any row asked for raw log-probs
    num_top: int = 0  # the most top alternatives a row asked for (0: none; rows cut theirs to their own k)


def sample(logits: torch.Tensor, st: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(token ids (B,), log-probs under the sampled distribution (B,), raw log-probs (B,) or None)."""
    if logits.is_cuda and not st.need_filter and not st.num_top and triton_kernels.available():
        return sample_fused(logits, st)
    return sample_torch(logits, st)


def _sampled_log_probs(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """log p (B, V) of the distribution each row samples from (after temperature and filtering), float32."""
    greedy = st.temperatures == 0
    scaled = logits / torch.where(greedy, 1.0, st.temperatures).unsqueeze(1)
    if st.need_filter:
        scaled = filter_top_k_top_p(scaled, st.top_k, st.top_p)
    return scaled.log_softmax(dim=-1)


def top_alternatives(logits: torch.Tensor, st: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """The `st.num_top` most likely tokens of each row's sampled distribution: ids (B, k) long and log-probs
    (B, k) float, most likely first."""
    values, ids = _sampled_log_probs(logits.float(), st).topk(st.num_top, dim=-1)
    return ids, values


def sample_torch(logits: torch.Tensor, st: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`sample` in PyTorch ops (any device; the reference the fused kernel is tested against)."""
    logits = logits.float()
    greedy = st.temperatures == 0
    log_probs = _sampled_log_probs(logits, st)
    sampled = (log_probs + gumbel_noise(st.seeds, st.counters, logits.shape[-1])).argmax(dim=-1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    token_log_probs = log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    raw = logits.log_softmax(dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1) if st.need_raw else None
    return tokens, token_log_probs, raw


def sample_fused(logits: torch.Tensor, st: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`sample` without top-k/top-p in one Triton pass over the logits (CUDA): the same tokens and log-probs."""
    tokens, lse, raw_lse = triton_kernels.fused_sample(logits, st.temperatures, st.seeds, st.counters, st.need_raw)
    picked = logits.gather(1, tokens.unsqueeze(1)).squeeze(1).float()
    divisor = torch.where(st.temperatures == 0, 1.0, st.temperatures)
    return tokens, picked / divisor - lse, picked - raw_lse if st.need_raw else None
