"""The engine with tensor parallelism on 2 gloo ranks (CPU): the same tokens and log-probs as one full copy, weight
updates from full HF tensors, preemption in lockstep, the worker's gather-generate-return path, the hybrid worker
(FSDP2 actor update -> TP=2 generation with the synced weights), and clear errors. On a machine with 2 GPUs, the same
over NCCL with CUDA graphs and decode windows (marked gpu).

One spawned pair of ranks computes the engine cases (`tp_results`); each test checks one part against a TP=1 run here.
    python -m pytest tests/rollout/test_tensor_parallel.py -q
"""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.distributed as dist

from hyflow import fields as F
from hyflow.config.actor_rollout_ref import ActorRolloutRefConfig, RolloutConfig
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.models import build_model
from hyflow.engine.parallel import EnginePlacement, ShardLayout, TensorParallel
from hyflow.models.tiny import build_tiny_model, peak_weights
from hyflow.protocol import DataProto
from hyflow.rollout.worker_rollout import EngineRollout

from ..rollout.rollout_testkit import prompt_batch
from ..workers.conftest import make_ppo_batch
from ..workers.distributed import run_ranks
from .engine_testkit import hf_greedy, make_tiny_hf_model

PROMPTS = [[5, 9, 13, 17, 21, 3, 7, 8, 9], [11, 4, 8], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10, n=2, seed=5, ignore_eos=True, raw_log_probs=True)
# (family, config overrides): KV heads split 2 ways (qwen2 with tied embeddings; qwen3 with an odd vocabulary, so
# the last rank's vocab rows hold padding), and one KV head replicated on both ranks with the biases of the
# row-parallel o_proj and down_proj (added once, after the all-reduce).
CASES = {
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"vocab_size": 95}),
    "llama_one_kv_head": ("llama", {"num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True}),
    "qwen2_moe": ("qwen2_moe", {}),  # experts' columns split, fused gate_up cut per rank, shared expert split
    "mixtral": ("mixtral", {}),
}
WORKER_PROMPTS = [[[5, 9, 13, 17, 21, 3], [11, 4, 8]], [[30, 31, 32, 33], [7, 7, 2, 6, 1]]]  # one chunk per rank


def _engine(hf: torch.nn.Module, tp_size: int, **overrides) -> LLMEngine:
    settings = dict(block_size=4, max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=64, device="cpu")
    settings.update(overrides)
    return LLMEngine(hf, EngineConfig(tensor_parallel_size=tp_size, **settings))


def _run(engine: LLMEngine) -> dict:
    """Greedy tokens, and sampled tokens / log-probs / raw log-probs of every sample."""
    greedy = [out.outputs[0].token_ids for out in engine.generate(PROMPTS, GREEDY)]
    samples = [o for out in engine.generate(PROMPTS, SAMPLED) for o in out.outputs]
    return {
        "greedy": greedy,
        "sampled": [o.token_ids for o in samples],
        "log_probs": [o.log_probs for o in samples],
        "raw_log_probs": [o.raw_log_probs for o in samples],
    }


def _rollout_config(tp_size: int) -> RolloutConfig:
    return RolloutConfig(
        prompt_length=8,
        response_length=6,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        temperature=1.0,
        ignore_eos=True,
        tensor_model_parallel_size=tp_size,
    )


def _worker_rows(rollout: EngineRollout, rank: int) -> dict:
    out = rollout.generate_sequences(prompt_batch(WORKER_PROMPTS[rank], seed=7)).batch
    return {"responses": out[F.RESPONSES], "log_probs": out[F.ROLLOUT_LOG_PROBS], "mask": out[F.RESPONSE_MASK]}


def _async_error(rollout: EngineRollout) -> str:
    try:
        asyncio.run(rollout.generate([5, 9], SamplingParams(max_tokens=2)))
    except ValueError as error:
        return str(error)
    return "no error"


def _tp_rank_runs(rank: int) -> dict:
    results: dict = {}
    for case, (family, overrides) in CASES.items():
        engine = _engine(make_tiny_hf_model(family, **overrides), 2)
        results[case] = _run(engine)
        results[case]["cache_kv_heads"] = engine.runner.kv_cache.shape[4]
        results[case]["lm_head_rows"] = engine.model.lm_head.weight.shape[0]
    updated = _engine(make_tiny_hf_model("qwen2", seed=0), 2)
    updated.load_weights(make_tiny_hf_model("qwen2", seed=1).state_dict().items())
    results["updated"] = [out.outputs[0].token_ids for out in updated.generate(PROMPTS, GREEDY)]
    small = _engine(make_tiny_hf_model("qwen3"), 2, num_kv_blocks=8)
    results["preempted"] = [out.outputs[0].token_ids for out in small.generate(PROMPTS * 2, GREEDY)]
    results["num_preemptions"] = small.scheduler.num_preemptions
    rollout = EngineRollout(make_tiny_hf_model("llama"), _rollout_config(2), tokenizer=None)
    results["worker"] = _worker_rows(rollout, rank)
    results["async_error"] = _async_error(rollout)
    return results


@pytest.fixture(scope="module")
def tp_results() -> list[dict]:
    return run_ranks(_tp_rank_runs, 2, timeout_s=240)


@pytest.mark.multiproc
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(CASES))
def test_tp2_greedy_tokens_equal_tp1_and_sampled_log_probs_match_in_fp32(tp_results, case):
    family, overrides = CASES[case]
    expected = _run(_engine(make_tiny_hf_model(family, **overrides), 1))
    for results in tp_results:
        got = results[case]
        assert got["greedy"] == expected["greedy"]
        assert got["sampled"] == expected["sampled"]
        for key in ("log_probs", "raw_log_probs"):
            torch.testing.assert_close(torch.tensor(got[key]), torch.tensor(expected[key]), atol=1e-5, rtol=1e-5)
    assert tp_results[0][case] == tp_results[1][case]  # the ranks agree exactly


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_each_tp_rank_holds_only_its_own_kv_heads_and_vocab_rows(tp_results):
    for results in tp_results:
        assert results["qwen2"]["cache_kv_heads"] == 1  # 2 KV heads split over 2 ranks
        assert results["llama_one_kv_head"]["cache_kv_heads"] == 1  # 1 KV head replicated
        assert results["qwen2"]["lm_head_rows"] == 48 and results["qwen3"]["lm_head_rows"] == 48  # 96 / 2, 95 -> 96


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_tp2_load_weights_with_full_tensors_gives_the_new_models_outputs(tp_results):
    new = make_tiny_hf_model("qwen2", seed=1)
    expected = [hf_greedy(new, prompt, 12) for prompt in PROMPTS]
    assert tp_results[0]["updated"] == tp_results[1]["updated"] == expected


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_tp2_ranks_preempt_in_lockstep_and_finish_like_tp1(tp_results):
    outputs = _engine(make_tiny_hf_model("qwen3"), 1).generate(PROMPTS * 2, GREEDY)
    expected = [out.outputs[0].token_ids for out in outputs]
    for results in tp_results:
        assert results["preempted"] == expected
        assert results["num_preemptions"] > 0


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_tp2_worker_rollout_returns_each_ranks_own_rows_equal_to_tp1(tp_results, monkeypatch):
    hf = make_tiny_hf_model("llama")
    for rank, results in enumerate(tp_results):
        monkeypatch.setenv("RANK", str(rank))  # row seeds derive from (batch seed, rank, row)
        expected = _worker_rows(EngineRollout(hf, _rollout_config(1), tokenizer=None), rank)
        got = results["worker"]
        assert torch.equal(got["responses"], expected["responses"]) and torch.equal(got["mask"], expected["mask"])
        torch.testing.assert_close(got["log_probs"], expected["log_probs"], atol=1e-5, rtol=1e-5)
    assert not torch.equal(tp_results[0]["worker"]["responses"], tp_results[1]["worker"]["responses"])


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_tp2_async_per_request_api_is_a_clear_error(tp_results):
    for results in tp_results:
        assert "async per-request API" in results["async_error"]
        assert "tensor_model_parallel_size=2" in results["async_error"]


def _gpu_rank_runs(rank: int) -> dict:
    """TP=2 over NCCL on GPUs `rank`, with CUDA graphs (single steps and decode windows) and eagerly."""
    torch.cuda.set_device(rank)
    group = dist.new_group([0, 1], backend="nccl")  # the world (from run_ranks) is gloo
    hf = make_tiny_hf_model("qwen2")
    results = {}
    for enforce_eager in (False, True):
        for steps in (1, 8):
            settings = dict(device="cuda", dtype="float32", enforce_eager=enforce_eager, num_scheduler_steps=steps)
            config = EngineConfig(tensor_parallel_size=2, block_size=4, max_model_len=64, num_kv_blocks=64, **settings)
            engine = LLMEngine(hf, config, tp_group=group)
            results[(enforce_eager, steps)] = _run(engine)
            graphs = engine.runner.graphs
            results[(enforce_eager, steps)]["captured"] = bool(graphs and (graphs.graphs or graphs.window_graphs))
            engine.close()  # before the NCCL group goes: a live graph with collectives hangs its destruction
    return results


@pytest.mark.gpu
@pytest.mark.multiproc
@pytest.mark.timeout(600)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_tp2_on_two_gpus_with_nccl_and_cuda_graphs_equals_tp1():
    hf = make_tiny_hf_model("qwen2")
    config = EngineConfig(block_size=4, max_model_len=64, num_kv_blocks=64, device="cuda", dtype="float32")
    expected = _run(LLMEngine(hf, config))
    rank0, rank1 = run_ranks(_gpu_rank_runs, 2, timeout_s=540)
    assert rank0 == rank1
    for (enforce_eager, _steps), got in rank0.items():
        assert got["greedy"] == [hf_greedy(hf, prompt, 12) for prompt in PROMPTS]
        assert got["sampled"] == expected["sampled"]
        log_probs, expected_log_probs = torch.tensor(got["log_probs"]), torch.tensor(expected["log_probs"])
        torch.testing.assert_close(log_probs, expected_log_probs, atol=1e-4, rtol=1e-4)
        assert got["captured"] != enforce_eager


def _hybrid_worker_rank_runs(rank: int, path: str, data: DataProto) -> tuple[torch.Tensor, dict]:
    """The hybrid engine on 2 ranks: FSDP2 actor update, then TP=2 generation with the synced weights."""
    from hyflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    config = ActorRolloutRefConfig()
    config.model.path = path
    config.actor.ppo_mini_batch_size, config.actor.ppo_micro_batch_size_per_gpu = 2, 2
    config.actor.optim.lr = 1e-2
    rollout = config.rollout
    rollout.n, rollout.prompt_length, rollout.response_length, rollout.ignore_eos = 2, 6, 5, True
    rollout.max_num_batched_tokens, rollout.tensor_model_parallel_size = 64, 2
    worker = ActorRolloutRefWorker(config, actor=True, rollout=True)
    worker.init_model()
    worker.update_actor(data.chunk(2)[rank])
    out = worker.generate_sequences(prompt_batch(WORKER_PROMPTS[rank], do_sample=False))
    return out.batch[F.RESPONSES], {name: tensor.clone() for name, tensor in worker.actor_weights()}


@pytest.fixture(scope="module")
def peaked_tiny_model_path(tmp_path_factory) -> str:
    """A tiny model folder (with tokenizer) whose weights are large enough for clear greedy choices."""
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("tp_tiny") / "qwen2", arch="qwen2", hidden_size=32)
    peak_weights(AutoModelForCausalLM.from_pretrained(path)).save_pretrained(path)
    return path


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_hybrid_worker_with_tp2_generates_with_the_updated_actor_weights(peaked_tiny_model_path):
    from transformers import AutoModelForCausalLM

    data = make_ppo_batch(batch_size=8, seed=3)
    results = run_ranks(_hybrid_worker_rank_runs, 2, peaked_tiny_model_path, data, timeout_s=240)
    updated = AutoModelForCausalLM.from_pretrained(peaked_tiny_model_path).eval()
    missing, unexpected = updated.load_state_dict(results[0][1], strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected  # the LM head is tied to the embedding
    before = AutoModelForCausalLM.from_pretrained(peaked_tiny_model_path).eval()
    changed = False
    for rank, (responses, _) in enumerate(results):
        expected = [hf_greedy(updated, prompt, 5) for prompt in WORKER_PROMPTS[rank]]
        assert responses.tolist() == expected
        changed |= expected != [hf_greedy(before, prompt, 5) for prompt in WORKER_PROMPTS[rank]]
    assert changed, "the update did not change any greedy response, so the test cannot see the weight sync"


def test_heads_not_divisible_by_tp_size_is_an_error_naming_the_allowed_sizes():
    hf_config = make_tiny_hf_model("llama", num_attention_heads=4, num_key_value_heads=2).config
    with pytest.raises(
        ValueError,
        match=r"num_attention_heads=4 is not divisible by tensor_model_parallel_size=3.*"
        r"\[1, 2, 4\]",
    ):
        build_model(hf_config, 64, tp=TensorParallel(size=3, rank=0))


def test_kv_heads_that_neither_split_nor_replicate_evenly_are_an_error():
    with pytest.raises(ValueError, match=r"num_key_value_heads=3 and tensor_model_parallel_size=2"):
        ShardLayout.for_rank(num_heads=6, num_kv_heads=3, intermediate_size=8, vocab_size=96, tp_size=2, tp_rank=0)


def test_shard_layout_gives_each_rank_the_kv_heads_its_query_heads_read():
    # 8 query heads, 2 KV heads (4 queries each), 4 ranks: ranks 0-1 read KV head 0, ranks 2-3 KV head 1.
    layouts = [ShardLayout.for_rank(8, 2, 16, 10, 4, rank) for rank in range(4)]
    assert [(lay.head_start, lay.num_heads) for lay in layouts] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert [(lay.kv_head_start, lay.num_kv_heads) for lay in layouts] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    assert [(lay.intermediate_start, lay.intermediate_size) for lay in layouts] == [(0, 4), (4, 4), (8, 4), (12, 4)]
    # 10 vocabulary rows over 4 ranks: 3 each, the last holding 1 real row and 2 of padding.
    assert [(lay.vocab_start, lay.vocab_rows, lay.vocab_real_rows) for lay in layouts] == [
        (0, 3, 3),
        (3, 3, 3),
        (6, 3, 3),
        (9, 3, 1),
    ]


def test_engine_placement_puts_each_engine_on_consecutive_ranks():
    placement = EnginePlacement(world_size=8, tp_size=4)
    assert placement.num_engines == 2 and placement.ranks_of(1) == [4, 5, 6, 7]
    assert [placement.engine_of(rank) for rank in range(8)] == [0] * 4 + [1] * 4
    assert [placement.tp_rank_of(rank) for rank in range(8)] == [0, 1, 2, 3] * 2
    assert EnginePlacement(world_size=8).num_engines == 8  # one engine per device
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=4 must divide .* 6; pick one of \[1, 2, 3, 6\]"):
        EnginePlacement(world_size=6, tp_size=4)


def test_tensor_parallel_without_a_process_group_is_a_clear_error():
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=2 needs a torch\.distributed process group"):
        _engine(make_tiny_hf_model("qwen2"), 2)
