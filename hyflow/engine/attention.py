"""Attention over the paged KV cache, one code path for prefill, decode and mixed batches, on CPU and CUDA.

A forward step carries T new tokens from B sequences. Each sequence has `q_len` new tokens at the end of a context
whose earlier tokens are already in the cache (a shared prefix, or the tokens of earlier steps). Per layer:

1. write the new tokens' K and V into their cache slots (`slot_mapping`);
2. gather each sequence's blocks from the cache (`block_tables`) into a padded (B, K) key/value view;
3. scaled-dot-product attention of the padded queries (B, Qmax) with a mask `key_pos <= query_pos` (and
   `query_pos - key_pos < window` for sliding-window layers), which is causal with the right offset;
4. scatter the padded outputs back to the T tokens (`token_index`).

On CUDA, a step with one new token per sequence (decode) instead runs a Triton kernel that reads the blocks in
place (triton_kernels.decode_attention); it computes the same thing without the gather copy or the mask.

Grouped-query attention never copies K/V: the G query heads of one KV head are stacked along the query axis.
Shapes: q (T, H, D), k/v (T, Hkv, D), cache (num_blocks, block_size, Hkv, D), G = H / Hkv.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hyflow.engine import triton_kernels


@dataclass
class AttentionMetadata:
    """Where the tokens of one forward step live. The tensors are what CUDA graphs capture; `from_zero` is a
    host-side fact about the step (every sequence's new tokens start at position 0: a prefill without cache hits),
    which lets attention use SDPA's own causal masking instead of a materialised mask."""

    slot_mapping: torch.Tensor  # (T,) long: cache slot (block * block_size + offset) of each new token
    block_tables: torch.Tensor  # (B, max_blocks) long: the cache blocks of each sequence, padded with a valid id
    query_index: torch.Tensor  # (B, Qmax) long: the new token (in 0..T-1) at each padded query slot
    query_positions: torch.Tensor  # (B, Qmax) long: the position of each padded query (0 for padding)
    token_index: torch.Tensor  # (T,) long: the padded slot (b * Qmax + i) of each new token
    logits_index: torch.Tensor  # (B,) long: the last new token of each sequence, whose logits we sample from
    from_zero: bool = False


def build_attention_mask(meta: AttentionMetadata, block_size: int, window: int | None = None) -> torch.Tensor:
    """Boolean mask (B, 1, Qmax, K): a query at position p sees the keys at positions <= p (within `window`)."""
    num_keys = meta.block_tables.shape[1] * block_size
    key_pos = torch.arange(num_keys, device=meta.query_positions.device)
    query_pos = meta.query_positions.unsqueeze(-1)  # (B, Qmax, 1)
    mask = key_pos <= query_pos
    if window is not None:
        mask = mask & (query_pos - key_pos < window)
    return mask.unsqueeze(1)


class AttentionMasks:
    """The masks of one step, one per sliding window, built on first use (the Triton decode path needs none)."""

    def __init__(self, meta: AttentionMetadata, block_size: int) -> None:
        self.meta, self.block_size = meta, block_size
        self.masks: dict[int | None, torch.Tensor] = {}

    def get(self, window: int | None) -> torch.Tensor:
        if window not in self.masks:
            self.masks[window] = build_attention_mask(self.meta, self.block_size, window)
        return self.masks[window]


def write_kv_cache(
    k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Stores the new tokens' keys and values (T, Hkv, D) in their cache slots."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, meta.slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, meta.slot_mapping, v)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    masks: AttentionMasks,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """Attention of the new queries (T, H, D) over their sequences' cached keys/values; returns (T, H, D)."""
    if meta.query_index.shape[1] == 1 and q.is_cuda and triton_kernels.available():
        positions = meta.query_positions[:, 0]
        return triton_kernels.decode_attention(q, k_cache, v_cache, meta.block_tables, positions, scale, window)
    if meta.from_zero and window is None:
        return causal_prefill_attention(q, k_cache, v_cache, meta, scale)
    return sdpa_paged_attention(q, k_cache, v_cache, meta, masks.get(window), scale)


def causal_prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Prefill from position 0: query i sees keys 0..i, which is SDPA's `is_causal` on a square (Qmax x Qmax)
    problem (every backend aligns square causal masks alike); no mask is materialised, so long prompts stay cheap.
    Padded query rows see padded keys, and are dropped."""
    num_heads, head_dim = q.shape[1:]
    batch, q_max = meta.query_index.shape
    queries = q[meta.query_index].transpose(1, 2)  # (B, H, Qmax, D)
    keys = k_cache[meta.block_tables].flatten(1, 2)[:, :q_max].transpose(1, 2)  # (B, Hkv, Qmax, D)
    values = v_cache[meta.block_tables].flatten(1, 2)[:, :q_max].transpose(1, 2)
    out = F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).reshape(batch * q_max, num_heads, head_dim)[meta.token_index]


def sdpa_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The general path: gather the blocks, SDPA with the positional mask (any mix of prefill and decode)."""
    _num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    batch, q_max = meta.query_index.shape
    # (B, Qmax, Hkv, G, D) -> (B, Hkv, G * Qmax, D): the G heads sharing a KV head ride along the query axis.
    queries = q[meta.query_index].view(batch, q_max, num_kv_heads, group, head_dim)
    queries = queries.permute(0, 2, 3, 1, 4).reshape(batch, num_kv_heads, group * q_max, head_dim)
    keys = k_cache[meta.block_tables].flatten(1, 2).transpose(1, 2)  # (B, Hkv, K, D)
    values = v_cache[meta.block_tables].flatten(1, 2).transpose(1, 2)
    group_mask = mask.unsqueeze(2).expand(batch, 1, group, q_max, mask.shape[-1]).reshape(batch, 1, group * q_max, -1)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=group_mask, scale=scale)
    out = out.view(batch, num_kv_heads, group, q_max, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(batch * q_max, num_heads, head_dim)[meta.token_index]
