"""One Triton launch per layer that rotates q and k (RoPE) and writes k and v into their KV-cache slots.

The PyTorch path is three launches (`ops.apply_rope`, then `attention.write_kv_cache`'s two `index_copy_`); in a
decode step at a small batch each launch costs more than its work, so fusing them shortens the step. Per token t
at position p_t with cache slot s_t, for every head h (RoFormer, Su et al. 2021):

    q'[t, h] = q[t, h] * cos[p_t] + rotate_half(q[t, h]) * sin[p_t]
    k_cache[s_t, h] = k[t, h] * cos[p_t] + rotate_half(k[t, h]) * sin[p_t]
    v_cache[s_t, h] = v[t, h]

rotate_half(x) = (-x[D/2:], x[:D/2]). As the compiled `apply_rope`, cos and sin are rounded to q's dtype, the
products summed in fp32 and the result rounded once. q, k and v may be strided views (the halves of the fused QKV
projection's output); the cache is (slots, Hkv, D) per layer. `available()` says whether Triton and CUDA are there.
"""

from __future__ import annotations

import torch

from hyflow.engine.triton_kernels import available, tl, triton  # noqa: F401 (available: this module's API)

if triton is not None:

    @triton.jit
    def _rotate(base, heads, num_heads, d, partner, cos, sin, HEAD_DIM: tl.constexpr):
        """The rotated (heads, D) rows at `base + head offsets`, in fp32, and their mask."""
        mask = (heads < num_heads) & (d[None, :] < HEAD_DIM)
        x = tl.load(base + d[None, :], mask=mask, other=0.0).to(tl.float32)
        x_partner = tl.load(base + partner[None, :], mask=mask, other=0.0).to(tl.float32)
        return x * cos[None, :] + x_partner * sin[None, :], mask

    @triton.jit
    def _rope_write_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        q_out_ptr,
        k_cache_ptr,
        v_cache_ptr,
        cos_ptr,
        sin_ptr,
        positions_ptr,
        slots_ptr,
        q_stride_t,
        q_stride_h,
        k_stride_t,
        k_stride_h,
        v_stride_t,
        v_stride_h,
        cache_stride_slot,
        cache_stride_head,
        NUM_HEADS: tl.constexpr,
        NUM_KV_HEADS: tl.constexpr,
        HEADS_PAD: tl.constexpr,
        KV_HEADS_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        DIM_PAD: tl.constexpr,
    ):
        """One program per token: all its query heads, then all its KV heads."""
        t = tl.program_id(0).to(tl.int64)
        position = tl.load(positions_ptr + t).to(tl.int64)
        slot = tl.load(slots_ptr + t).to(tl.int64)
        d = tl.arange(0, DIM_PAD)
        half = HEAD_DIM // 2
        partner = tl.where(d < half, d + half, d - half)
        sign = tl.where(d < half, -1.0, 1.0)
        in_dim = d < HEAD_DIM
        dtype = q_out_ptr.dtype.element_ty
        cos = tl.load(cos_ptr + position * HEAD_DIM + d, mask=in_dim, other=0.0).to(dtype).to(tl.float32)
        sin = tl.load(sin_ptr + position * HEAD_DIM + d, mask=in_dim, other=0.0).to(dtype).to(tl.float32) * sign

        heads = tl.arange(0, HEADS_PAD)[:, None]
        q, q_mask = _rotate(
            q_ptr + t * q_stride_t + heads * q_stride_h, heads, NUM_HEADS, d, partner, cos, sin, HEAD_DIM
        )
        q_out = q_out_ptr + t * (NUM_HEADS * HEAD_DIM) + heads * HEAD_DIM + d[None, :]
        tl.store(q_out, q.to(dtype), mask=q_mask)

        kv_heads = tl.arange(0, KV_HEADS_PAD)[:, None]
        k_base = k_ptr + t * k_stride_t + kv_heads * k_stride_h
        k, kv_mask = _rotate(k_base, kv_heads, NUM_KV_HEADS, d, partner, cos, sin, HEAD_DIM)
        cache_offsets = slot * cache_stride_slot + kv_heads * cache_stride_head + d[None, :]
        tl.store(k_cache_ptr + cache_offsets, k.to(k_cache_ptr.dtype.element_ty), mask=kv_mask)
        v = tl.load(v_ptr + t * v_stride_t + kv_heads * v_stride_h + d[None, :], mask=kv_mask, other=0.0)
        tl.store(v_cache_ptr + cache_offsets, v.to(v_cache_ptr.dtype.element_ty), mask=kv_mask)


def rope_and_write_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """Rotated q (T, H, D), contiguous; rotated k and v land in `k_cache` / `v_cache` (..., Hkv, D) at
    `slot_mapping` (T,). q, k, v: (T, H or Hkv, D) with unit stride along D; cos/sin tables (positions, D) fp32."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert q.stride(2) == k.stride(2) == v.stride(2) == 1, "head dim must be contiguous"
    assert cos_table.is_contiguous() and sin_table.is_contiguous() and cos_table.shape[1] == head_dim
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    q_out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    _rope_write_kernel[(num_tokens,)](
        q, k, v, q_out, k_flat, v_flat, cos_table, sin_table, positions, slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_flat.stride(0), k_flat.stride(1),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads,
        HEADS_PAD=triton.next_power_of_2(num_heads), KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim, DIM_PAD=triton.next_power_of_2(head_dim),
    )  # fmt: skip
    return q_out
