"""The engine's mixture-of-experts layer: transformers' routing exactly, both expert layouts of a checkpoint, a TP
rank's slices of the experts, in-place weight updates and sleep/wake, and a clear error for a mislaid expert."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.models import build_model, load_model
from hyflow.engine.models.moe import route
from hyflow.engine.parallel import TensorParallel

from .engine_testkit import hf_greedy, make_tiny_hf_model

PROMPTS = [[5, 9, 13, 17, 21, 3, 7, 8, 9], [11, 4, 8]]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral")


def _engine(source) -> LLMEngine:
    """On the CPU in fp32, as the reference (test_gpu.py covers the MoE families on CUDA, graphs and all)."""
    config = EngineConfig(block_size=4, max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=64, device="cpu")
    return LLMEngine(source, config)


def _tokens(engine: LLMEngine) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in engine.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_routing_chooses_the_experts_and_weights_of_the_transformers_router(family):
    router = make_tiny_hf_model(family).model.layers[0].mlp.gate
    x = torch.randn(7, router.hidden_dim)
    with torch.no_grad():
        _, expected_weights, expected_ids = router(x)
        logits = torch.nn.functional.linear(x, router.weight)
    normalize = family == "mixtral" or router.norm_topk_prob
    weights, ids = route(logits, router.top_k, normalize, None if family == "mixtral" else x.dtype)
    assert torch.equal(ids, expected_ids)
    assert torch.equal(weights, expected_weights)
    assert torch.allclose(weights.sum(-1), torch.ones(7)) == normalize


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral"])
def test_a_checkpoint_with_per_expert_tensors_generates_like_transformers(tmp_path, family):
    hf = make_tiny_hf_model(family)
    hf.save_pretrained(tmp_path)  # on disk transformers names each expert (Mixtral: block_sparse_moe...w1/w2/w3)
    names = load_file(tmp_path / "model.safetensors").keys()
    assert any(".experts.3." in name for name in names)
    assert _tokens(_engine(str(tmp_path))) == [hf_greedy(hf, p, 10) for p in PROMPTS]


def test_a_tp_rank_reads_its_expert_slices_from_per_expert_tensors_as_it_cuts_them_from_fused_ones(tmp_path):
    hf = make_tiny_hf_model("qwen2_moe")
    hf.save_pretrained(tmp_path)
    for rank in (0, 1):
        tp = TensorParallel(size=2, rank=rank)  # loading needs no process group
        from_folder = load_model(str(tmp_path), max_positions=64, tp=tp)
        from_fused = build_model(hf.config, 64, tp=tp)
        from_fused.load_weights(hf.state_dict().items())  # in memory, transformers 5 holds experts fused
        assert from_folder.model.layers[0].mlp.experts.w13.shape[1] == 2 * 32 // 2
        for (name, ours), theirs in zip(from_folder.state_dict().items(), from_fused.state_dict().values()):
            assert torch.equal(ours, theirs), name


def test_weights_loaded_in_place_change_the_outputs_as_a_fresh_load_would_and_survive_sleep():
    old, new = make_tiny_hf_model("qwen3_moe", seed=0), make_tiny_hf_model("qwen3_moe", seed=1)
    engine = _engine(old)
    before = _tokens(engine)
    w13 = engine.model.model.layers[0].mlp.experts.w13
    address = w13.data_ptr()
    engine.load_weights(new.state_dict().items())
    after = _tokens(engine)
    assert after != before and after == _tokens(_engine(new))
    assert w13.data_ptr() == address  # in place: a weight update never reallocates the experts
    engine.sleep()
    engine.wake()
    assert _tokens(engine) == after


def test_an_expert_tensor_of_the_wrong_shape_is_refused_naming_it(tmp_path):
    hf = make_tiny_hf_model("mixtral")
    hf.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    name = "model.layers.1.block_sparse_moe.experts.2.w2.weight"
    weights[name] = weights[name][:, :16].contiguous()
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    expected = r"'model\.layers\.1\.block_sparse_moe\.experts\.2\.w2\.weight' has shape \(64, 16\).*\(64, 128\)"
    with pytest.raises(ValueError, match=expected):
        load_model(str(tmp_path))
