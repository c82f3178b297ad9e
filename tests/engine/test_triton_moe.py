"""The fused MoE kernels (triton_moe.py) compute what the eager grouped experts compute: every routing, experts
that get no token, one decode token and a prefill's many, fp32 and bf16."""

from __future__ import annotations

import pytest
import torch

from hyflow.engine.models.moe import grouped_experts, route

from .engine_testkit import TRITON_DEVICE, needs_triton


def _case(num_tokens: int, num_experts: int, top_k: int, hidden: int, columns: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen).to(TRITON_DEVICE, dtype)
    w13 = (torch.randn(num_experts, 2 * columns, hidden, generator=gen) / hidden**0.5).to(TRITON_DEVICE, dtype)
    w2 = (torch.randn(num_experts, hidden, columns, generator=gen) / columns**0.5).to(TRITON_DEVICE, dtype)
    logits = torch.randn(num_tokens, num_experts, generator=gen).to(TRITON_DEVICE)
    logits[:, -1] = -1e4  # the last expert gets no token
    weights, expert_ids = route(logits, top_k, normalize=True, out_dtype=None)
    return x, expert_ids, weights, w13, w2


@needs_triton
def test_aligned_rows_hold_every_pair_once_in_blocks_of_one_expert():
    from hyflow.engine.triton_moe import align_pairs

    expert_ids = torch.tensor([[2, 0], [2, 1], [0, 2], [2, 1]], device=TRITON_DEVICE)
    rows, block_experts = align_pairs(expert_ids, num_experts=4, block_m=2)
    flat = expert_ids.flatten()
    real = rows[rows < flat.numel()].long()
    assert sorted(real.tolist()) == list(range(flat.numel()))
    for block, expert in enumerate(block_experts.tolist()):
        pairs = rows[block * 2 : block * 2 + 2]
        pairs = pairs[pairs < flat.numel()].long()
        if expert >= 4:
            assert pairs.numel() == 0
        else:
            assert (flat[pairs] == expert).all() and pairs.numel() > 0


@needs_triton
@pytest.mark.parametrize("num_tokens", [1, 5, 70, 300], ids=["decode-1", "decode-5", "mid-70", "prefill-300"])
def test_fused_experts_equal_the_grouped_eager_experts_in_fp32(num_tokens):
    from hyflow.engine.triton_moe import fused_experts

    args = _case(num_tokens, num_experts=6, top_k=2, hidden=48, columns=40, dtype=torch.float32, seed=num_tokens)
    torch.testing.assert_close(fused_experts(*args), grouped_experts(*args), atol=2e-5, rtol=2e-5)


@pytest.mark.gpu
@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 dots need a CUDA device")
def test_fused_experts_agree_with_the_grouped_eager_experts_in_bf16_at_a_real_width():
    from hyflow.engine.triton_moe import fused_experts

    args = _case(300, num_experts=64, top_k=8, hidden=1024, columns=256, dtype=torch.bfloat16, seed=1)
    fused, eager = fused_experts(*args).float(), grouped_experts(*args).float()
    assert (fused - eager).abs().max() <= 0.02 * eager.abs().max()
