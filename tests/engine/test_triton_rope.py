"""The fused RoPE + KV-cache write kernel equals the PyTorch path (ops.apply_rope, then attention.write_kv_cache).

Runs where `engine_testkit.needs_triton` lets it: CUDA, or the CPU under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from hyflow.engine.attention import AttentionMetadata, write_kv_cache
from hyflow.engine.models.ops import apply_rope
from hyflow.engine.models.rope import RotaryEmbedding

from .engine_testkit import TRITON_DEVICE, needs_triton

pytestmark = needs_triton
DEVICE = TRITON_DEVICE


def qkv_views(num_tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    """q, k, v as the strided halves of one fused projection output, as the engine's attention gets them."""
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=DEVICE)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return (
        q.view(num_tokens, heads, head_dim),
        k.view(num_tokens, kv_heads, head_dim),
        v.view(num_tokens, kv_heads, head_dim),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(14, 2, 64), (4, 4, 80)], ids=["gqa-64", "mha-80"])
def test_fused_rope_and_cache_write_equal_the_pytorch_path(dtype, heads, kv_heads, head_dim):
    from hyflow.engine.triton_rope import rope_and_write_cache

    torch.manual_seed(0)
    num_tokens, num_blocks, block_size = 6, 8, 4
    rotary = RotaryEmbedding(head_dim, 256, {"rope_type": "default", "rope_theta": 10000.0})
    cos, sin = rotary.cos.to(DEVICE), rotary.sin.to(DEVICE)
    q, k, v = qkv_views(num_tokens, heads, kv_heads, head_dim, dtype)
    positions = torch.tensor([0, 5, 17, 63, 128, 255], device=DEVICE)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    cache_shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache, v_cache = (torch.randn(cache_shape, dtype=dtype, device=DEVICE) for _ in range(2))
    expected_k_cache, expected_v_cache = k_cache.clone(), v_cache.clone()

    q_out = rope_and_write_cache(q, k, v, cos, sin, positions, k_cache, v_cache, slots)

    expected_q, expected_k = apply_rope(q, k, cos, sin, positions)
    meta = AttentionMetadata(slot_mapping=slots, block_tables=None, query_index=None, query_positions=None,
                             token_index=None, logits_index=None)  # fmt: skip
    write_kv_cache(expected_k_cache, expected_v_cache, meta, expected_k, v)
    # fp32: the same math; bf16: the kernel rounds once where eager PyTorch rounds after each op.
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 1e-2}
    torch.testing.assert_close(q_out, expected_q, **tolerance)
    torch.testing.assert_close(k_cache, expected_k_cache, **tolerance)  # untouched slots stay as they were
    assert torch.equal(v_cache, expected_v_cache)  # v is copied as is
