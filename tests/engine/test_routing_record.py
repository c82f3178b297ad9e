"""The engine's routing record (EngineConfig.record_routing): per token it computed, the experts each MoE layer
chose; equal to the routing of transformers' forward over the same tokens (fp32, CPU), shared prefixes included."""

from __future__ import annotations

import pytest
import torch

from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.routing_cache import has_record, no_record_value, routing_dtype

from .engine_testkit import make_tiny_hf_model

PROMPT = [5, 9, 13, 17, 21, 3, 7, 8, 9, 30, 31]  # 11 tokens: two full blocks of 4 shared by the samples
SAMPLED = SamplingParams(n=3, temperature=1.0, max_tokens=6, ignore_eos=True, seed=3)


def _engine(hf, record: bool = True) -> LLMEngine:
    config = EngineConfig(
        block_size=4, max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=64, device="cpu", record_routing=record
    )
    return LLMEngine(hf, config)


def hf_routing(hf, tokens: list[int]) -> torch.Tensor:
    """(len(tokens), num MoE layers, k): the experts transformers' routers choose for each token."""
    chosen = []
    hooks = [
        layer.mlp.gate.register_forward_hook(lambda _m, _i, out: chosen.append(out[2]))
        for layer in hf.model.layers
        if hasattr(layer.mlp, "gate")
    ]
    with torch.no_grad():
        hf(torch.tensor([tokens]))
    for hook in hooks:
        hook.remove()
    return torch.stack(chosen, dim=1)


def _count_forward_tokens(engine: LLMEngine) -> list[int]:
    counts, forward = [], engine.runner.forward
    engine.runner.forward = lambda ids, *args, **kw: counts.append(ids.numel()) or forward(ids, *args, **kw)
    return counts


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "mixtral"])
def test_the_record_of_every_sample_is_the_routing_transformers_chooses_for_its_prompt_and_response(family):
    hf = make_tiny_hf_model(family)
    engine = _engine(hf)
    computed = _count_forward_tokens(engine)
    samples = engine.generate([PROMPT], SAMPLED)[0].outputs
    for sample in samples:
        tokens = PROMPT + sample.token_ids
        record = sample.routed_experts
        assert record.dtype == torch.uint8
        assert record.shape[0] == len(tokens) - 1  # the last sampled token never goes through the model
        assert torch.equal(record.long(), hf_routing(hf, tokens)[: len(tokens) - 1])
    # the samples shared the prompt's first two blocks: their tokens were computed once, not three times
    assert sum(computed) < len(samples) * (len(PROMPT) + SAMPLED.max_tokens - 1)


def test_a_continuation_carries_the_routing_of_its_cached_prefix():
    """An agent's next turn: prompt = the last turn's tokens + tool tokens, its prefix taken from the cache."""
    hf = make_tiny_hf_model("qwen3_moe")
    engine = _engine(hf)
    first = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0].outputs[0]
    turn = PROMPT + first.token_ids + [40, 41, 42]
    computed = _count_forward_tokens(engine)
    second = engine.generate([turn], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0].outputs[0]
    tokens = turn + second.token_ids
    assert computed[0] < len(turn)  # the prefill skipped the cached blocks
    assert torch.equal(second.routed_experts.long(), hf_routing(hf, tokens)[:-1])


def test_without_record_routing_or_on_a_dense_model_there_is_no_record():
    quiet = _engine(make_tiny_hf_model("mixtral"), record=False)
    assert quiet.runner.routing is None
    assert quiet.generate([PROMPT], SAMPLED)[0].outputs[0].routed_experts is None
    dense = _engine(make_tiny_hf_model("qwen2"))
    assert dense.generate([PROMPT], SAMPLED)[0].outputs[0].routed_experts is None


def test_expert_ids_take_a_byte_up_to_255_experts_and_the_all_ones_value_marks_no_record():
    assert routing_dtype(255) == torch.uint8 and routing_dtype(256) == torch.int16
    ids = torch.tensor([[[3, 1]], [[255, 255]]], dtype=torch.uint8)
    assert has_record(ids).tolist() == [True, False]
    assert no_record_value(torch.int16) == -1
