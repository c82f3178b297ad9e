"""The engine on CUDA: CUDA-graph decode gives the same greedy tokens as eager and as `transformers` (fp32)."""

from __future__ import annotations

import pytest
import torch

from hyflow.rollout.config import EngineConfig, SamplingParams
from hyflow.rollout.engine import LLMEngine

from .rollout_testkit import hf_greedy, make_tiny_hf_model

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 9, 13, 17, 21, 3, 7, 8, 9], [11, 4, 8], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["cuda-graphs", "eager"])
def test_greedy_on_cuda_equals_transformers_greedy(family, enforce_eager):
    hf = make_tiny_hf_model(family)
    config = EngineConfig(
        block_size=4, max_model_len=64, num_kv_blocks=128, dtype="float32", device="cuda", enforce_eager=enforce_eager
    )
    engine = LLMEngine(hf, config)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    outputs = engine.generate(PROMPTS * 3, params)
    for prompt, out in zip(PROMPTS * 3, outputs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 20)
    if not enforce_eager:
        assert engine.runner.graphs.graphs, "no CUDA graph was captured"


@pytest.mark.timeout(300)
def test_cuda_graphs_survive_sleep_wake_and_weight_updates():
    old, new = make_tiny_hf_model("qwen2", seed=0), make_tiny_hf_model("qwen2", seed=1)
    config = EngineConfig(block_size=4, max_model_len=64, num_kv_blocks=128, dtype="float32", device="cuda")
    engine = LLMEngine(old, config)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine.generate(PROMPTS, params)
    engine.sleep()
    engine.wake()
    engine.load_weights(new.state_dict().items())
    outputs = engine.generate(PROMPTS, params)
    assert [o.outputs[0].token_ids for o in outputs] == [hf_greedy(new, p, 12) for p in PROMPTS]
    assert torch.cuda.is_available()


def test_triton_fused_sampler_draws_the_same_tokens_as_the_pytorch_sampler():
    from hyflow.rollout.sampler import SamplingTensors, sample, sample_fused

    torch.manual_seed(0)
    logits = (torch.randn(64, 5000) * 3).cuda()
    st = SamplingTensors(
        temperatures=torch.rand(64).cuda() + 0.3,
        top_k=torch.full((64,), -1).cuda(),
        top_p=torch.ones(64).cuda(),
        seeds=torch.arange(64).cuda(),
        counters=torch.arange(64).cuda() * 7,
        need_filter=True,
        need_raw=True,
    )
    st.temperatures[:4] = 0  # greedy rows
    reference = sample(logits, st)  # need_filter=True takes the PyTorch path (the filters are off anyway)
    fused = sample_fused(logits, st)
    assert torch.equal(fused[0], reference[0])
    torch.testing.assert_close(fused[1], reference[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fused[2], reference[2], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("window", [None, 7])
def test_triton_decode_attention_equals_the_sdpa_path(window):
    from hyflow.rollout.attention import AttentionMetadata, build_attention_mask, sdpa_paged_attention
    from hyflow.rollout.triton_kernels import decode_attention

    torch.manual_seed(0)
    batch, heads, kv_heads, dim, block_size, blocks = 5, 14, 2, 64, 16, 40
    k_cache = torch.randn(blocks, block_size, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
    tables = torch.randperm(blocks, device="cuda")[: batch * 6].view(batch, 6)
    positions = torch.tensor([0, 15, 16, 50, 95], device="cuda")
    rows = torch.arange(batch, device="cuda")
    meta = AttentionMetadata(
        slot_mapping=rows,
        block_tables=tables,
        query_index=rows[:, None],
        query_positions=positions[:, None],
        token_index=rows,
        logits_index=rows,
    )
    expected = sdpa_paged_attention(q, k_cache, v_cache, meta, build_attention_mask(meta, block_size, window), 0.125)
    out = decode_attention(q, k_cache, v_cache, tables, positions, 0.125, window)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
