"""The engine on CUDA: CUDA-graph decode gives the same greedy tokens as eager and as `transformers` (fp32), and
multi-step decode windows (graphs of whole steps) give the outputs of single steps."""

from __future__ import annotations

import pytest
import torch

from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine

from .engine_testkit import hf_greedy, make_tiny_hf_model

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 9, 13, 17, 21, 3, 7, 8, 9], [11, 4, 8], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]]


GREEDY_12 = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def cuda_engine(hf, **overrides) -> LLMEngine:
    """An engine on CUDA (fp32 with CUDA graphs unless `overrides` say otherwise), for the tests below."""
    settings = dict(block_size=4, max_model_len=64, num_kv_blocks=128, dtype="float32", device="cuda")
    return LLMEngine(hf, EngineConfig(**{**settings, **overrides}))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_scheduler_steps", [1, 8], ids=["single-step", "multi-step"])
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["cuda-graphs", "eager"])
def test_greedy_on_cuda_equals_transformers_greedy(family, enforce_eager, num_scheduler_steps):
    hf = make_tiny_hf_model(family)
    engine = cuda_engine(hf, enforce_eager=enforce_eager, num_scheduler_steps=num_scheduler_steps)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    outputs = engine.generate(PROMPTS * 3, params)
    for prompt, out in zip(PROMPTS * 3, outputs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 20)
    if not enforce_eager:
        graphs = engine.runner.graphs
        captured = graphs.graphs if num_scheduler_steps == 1 else graphs.window_graphs
        assert captured, "no CUDA graph was captured"


@pytest.mark.timeout(300)
def test_cuda_graphs_survive_sleep_wake_and_weight_updates():
    old, new = make_tiny_hf_model("qwen2", seed=0), make_tiny_hf_model("qwen2", seed=1)
    engine, params = cuda_engine(old), GREEDY_12
    engine.generate(PROMPTS, params)
    engine.sleep()
    engine.wake()
    engine.load_weights(new.state_dict().items())
    outputs = engine.generate(PROMPTS, params)
    assert [o.outputs[0].token_ids for o in outputs] == [hf_greedy(new, p, 12) for p in PROMPTS]
    assert torch.cuda.is_available()


@pytest.mark.timeout(300)
def test_graphs_are_kept_when_the_cache_returns_to_its_address_and_recaptured_when_it_moves():
    hf = make_tiny_hf_model("qwen2", seed=0)
    engine, params = cuda_engine(hf), GREEDY_12
    expected = [hf_greedy(hf, p, 12) for p in PROMPTS]
    engine.generate(PROMPTS, params)
    graphs = engine.runner.graphs
    address = engine.runner.kv_cache.data.data_ptr()
    engine.sleep()
    engine.wake()
    if engine.runner.kv_cache.data.data_ptr() == address:
        assert graphs.graphs or graphs.window_graphs, "graphs were dropped although the cache came back in place"
    assert [o.outputs[0].token_ids for o in engine.generate(PROMPTS, params)] == expected
    engine.sleep()
    squatter = torch.empty(engine.runner.kv_cache.shape, dtype=torch.float32, device="cuda")  # takes the address
    engine.wake()
    assert engine.runner.kv_cache.data.data_ptr() != squatter.data_ptr()
    assert [o.outputs[0].token_ids for o in engine.generate(PROMPTS, params)] == expected


@pytest.mark.timeout(300)
def test_wake_without_sleep_keeps_the_graphs_as_with_free_cache_engine_false():
    hf = make_tiny_hf_model("qwen2", seed=0)
    engine, params = cuda_engine(hf), GREEDY_12
    expected = [o.outputs[0].token_ids for o in engine.generate(PROMPTS, params)]
    captured = engine.runner.graphs.num_captures
    assert captured > 0
    engine.wake()  # the worker's rollout_mode when the cache was never freed
    assert [o.outputs[0].token_ids for o in engine.generate(PROMPTS, params)] == expected
    assert engine.runner.graphs.num_captures == captured


@pytest.mark.timeout(300)
def test_close_drops_the_graphs_and_the_cache_and_wake_captures_them_again():
    hf = make_tiny_hf_model("qwen2", seed=0)
    engine, params = cuda_engine(hf), GREEDY_12
    expected = [o.outputs[0].token_ids for o in engine.generate(PROMPTS, params)]
    engine.close()
    assert not engine.runner.graphs.graphs and not engine.runner.graphs.window_graphs
    assert not engine.runner.kv_cache.allocated
    engine.wake()
    assert [o.outputs[0].token_ids for o in engine.generate(PROMPTS, params)] == expected
    assert engine.runner.graphs.graphs or engine.runner.graphs.window_graphs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["cuda-graphs", "eager"])
def test_multi_step_windows_on_cuda_equal_single_steps(enforce_eager):
    hf = make_tiny_hf_model("qwen2")
    params = [
        SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[7]),  # greedy, may stop mid-window
        SamplingParams(n=3, temperature=1.0, max_tokens=17, seed=5, ignore_eos=True, raw_log_probs=True),
        SamplingParams(n=2, temperature=0.7, top_k=20, top_p=0.9, max_tokens=11, seed=9),
    ]
    results, engines = {}, {}
    for steps in (1, 8):
        engines[steps] = engine = cuda_engine(hf, enforce_eager=enforce_eager, num_scheduler_steps=steps)
        engine.eos_token_ids = {11}
        outputs = engine.generate(PROMPTS * 2, params * 2)
        results[steps] = [o for request in outputs for o in request.outputs]
    for multi, single in zip(results[8], results[1]):
        assert (multi.token_ids, multi.finish_reason) == (single.token_ids, single.finish_reason)
        torch.testing.assert_close(torch.tensor(multi.log_probs), torch.tensor(single.log_probs), atol=1e-4, rtol=1e-4)
        if single.raw_log_probs is not None:
            torch.testing.assert_close(
                torch.tensor(multi.raw_log_probs), torch.tensor(single.raw_log_probs), atol=1e-4, rtol=1e-4
            )
    if not enforce_eager:
        assert engines[8].runner.graphs.window_graphs, "no decode-window CUDA graph was captured"


@pytest.mark.timeout(300)
def test_async_scheduling_through_the_cuda_graphs_gives_the_outputs_of_one_window_at_a_time():
    """bf16 with graphs, the engine's own setting: the windows' outputs reach the host through pinned copies
    queued behind them, while the next window (queued first) overwrites the graphs' buffers."""
    hf = make_tiny_hf_model("qwen2")
    params = [
        SamplingParams(n=4, temperature=1.0, max_tokens=45, seed=5, ignore_eos=True, raw_log_probs=True),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
        SamplingParams(n=2, temperature=0.8, max_tokens=37, seed=3, ignore_eos=True),
    ]
    results, engines = {}, {}
    for async_scheduling in (False, True):
        engine = cuda_engine(hf, dtype="auto", num_kv_blocks=256, async_scheduling=async_scheduling)  # bf16
        engines[async_scheduling] = engine
        results[async_scheduling] = [o for r in engine.generate(PROMPTS * 2, params * 2) for o in r.outputs]
    for queued, one_at_a_time in zip(results[True], results[False]):
        assert (queued.token_ids, queued.finish_reason) == (one_at_a_time.token_ids, one_at_a_time.finish_reason)
        assert queued.log_probs == one_at_a_time.log_probs
        assert queued.raw_log_probs == one_at_a_time.raw_log_probs
    assert engines[True].in_flight.num_queued_ahead > 4 and engines[True].runner.graphs.window_graphs


@pytest.mark.parametrize("need_raw", [True, False], ids=["with-raw", "log-probs"])
@pytest.mark.parametrize("vocab_size", [5000, 40000], ids=["one-split", "three-splits"])
def test_triton_fused_sampler_draws_the_same_tokens_as_the_pytorch_sampler(vocab_size, need_raw):
    from hyflow.engine.sampler import SamplingTensors, sample_fused, sample_torch

    torch.manual_seed(0)
    rows = 512  # enough rows that noise computed imprecisely where it matters (u near 1) changes some token
    logits = (torch.randn(rows, vocab_size) * 3).cuda()  # the kernel cuts the vocabulary into 16k splits
    st = SamplingTensors(
        temperatures=torch.rand(rows).cuda() + 0.3,
        top_k=torch.full((rows,), -1).cuda(),
        top_p=torch.ones(rows).cuda(),
        seeds=torch.arange(rows).cuda(),
        counters=torch.arange(rows).cuda() * 7,
        need_filter=False,
        need_raw=need_raw,
    )
    st.temperatures[:4] = 0  # greedy rows
    logits[4, 100:103] = logits[4].max() + 1  # a greedy row with a three-way tie at the top: the first index wins
    st.temperatures[4] = 0
    reference = sample_torch(logits, st)
    fused = sample_fused(logits, st)
    assert torch.equal(fused[0], reference[0])
    torch.testing.assert_close(fused[1], reference[1], atol=1e-4, rtol=1e-4)
    if need_raw:
        torch.testing.assert_close(fused[2], reference[2], atol=1e-4, rtol=1e-4)
    else:
        assert fused[2] is None


@pytest.mark.parametrize("rows", [0, 3, 700])
def test_triton_silu_and_mul_equals_the_fp32_formula(rows):
    from hyflow.engine.triton_kernels import silu_and_mul

    torch.manual_seed(0)
    gate_up = torch.randn(rows, 2, 2 * 1500, device="cuda", dtype=torch.bfloat16)  # 1500: not a block multiple
    gate, up = gate_up.float().chunk(2, dim=-1)
    expected = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
    out = silu_and_mul(gate_up)
    assert out.shape == (rows, 2, 1500) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("window", [None, 7])
def test_triton_decode_attention_equals_the_sdpa_path(window):
    from hyflow.engine.attention import AttentionMetadata, build_attention_mask, sdpa_paged_attention
    from hyflow.engine.triton_kernels import decode_attention

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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_scheduler_steps", [1, 8], ids=["single-step", "multi-step"])
def test_the_routing_record_under_cuda_graphs_is_the_routing_of_transformers(num_scheduler_steps):
    from .test_routing_record import hf_routing

    hf = make_tiny_hf_model("qwen3_moe")
    params = SamplingParams(n=2, temperature=0, max_tokens=12, ignore_eos=True)
    engine = cuda_engine(hf, record_routing=True, num_scheduler_steps=num_scheduler_steps)
    for prompt, out in zip(PROMPTS, engine.generate(PROMPTS, params)):
        for sample in out.outputs:
            tokens = prompt + sample.token_ids
            assert torch.equal(sample.routed_experts.long(), hf_routing(hf, tokens)[:-1])
    graphs = engine.runner.graphs
    assert graphs.graphs if num_scheduler_steps == 1 else graphs.window_graphs, "no CUDA graph was captured"
