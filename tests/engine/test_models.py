"""The engine's decoder implementation reproduces the Hugging Face models' logits (fp32, tight tolerance)."""

from __future__ import annotations

import pytest
import torch

from hyflow.engine.attention import AttentionMetadata
from hyflow.engine.models import is_supported, iter_safetensors, load_model, tp_weight_slices
from hyflow.engine.models.llama import DecoderArgs

from .engine_testkit import make_tiny_hf_model


def _full_prefill_logits(model, prompts: list[list[int]], block_size: int = 4) -> list[torch.Tensor]:
    """Naive reference layout: each prompt in its own run of cache blocks, all tokens new, logits at every token."""
    args = model.args
    blocks_per_seq = max(-(-len(p) // block_size) for p in prompts)
    num_blocks = blocks_per_seq * len(prompts)
    caches = [
        (
            torch.zeros(num_blocks, block_size, args.num_kv_heads, args.head_dim),
            torch.zeros(num_blocks, block_size, args.num_kv_heads, args.head_dim),
        )
        for _ in range(args.num_layers)
    ]
    q_max = max(len(p) for p in prompts)
    ids, positions, slots, query_index, query_pos, token_index = [], [], [], [], [], []
    for b, prompt in enumerate(prompts):
        start = len(ids)
        ids += prompt
        positions += range(len(prompt))
        slots += [b * blocks_per_seq * block_size + i for i in range(len(prompt))]
        query_index.append([start + min(i, len(prompt) - 1) for i in range(q_max)])
        query_pos.append([i if i < len(prompt) else 0 for i in range(q_max)])
        token_index += [b * q_max + i for i in range(len(prompt))]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_index=torch.tensor(query_index),
        block_tables=torch.arange(num_blocks).view(len(prompts), blocks_per_seq),
        query_positions=torch.tensor(query_pos),
        token_index=torch.tensor(token_index),
        logits_index=torch.tensor([0] * len(prompts)),
    )
    hidden = model(torch.tensor(ids), torch.tensor(positions), meta, caches, block_size)
    logits = model.compute_logits(hidden)
    return list(logits.split([len(p) for p in prompts]))


@pytest.mark.timeout(120)
def test_engine_model_logits_equal_hf_logits_for_each_family(family):
    hf = make_tiny_hf_model(family)
    ours = load_model(hf, max_positions=64)
    prompts = [[5, 9, 13, 17, 21, 3, 7], [11, 4, 8], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
    for prompt, logits in zip(prompts, _full_prefill_logits(ours, prompts)):
        with torch.no_grad():
            expected = hf(torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "rope_scaling",
    [
        {"rope_type": "linear", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
        {"rope_type": "dynamic", "factor": 2.0},
    ],
    ids=lambda s: s["rope_type"],
)
def test_engine_model_matches_hf_under_rope_scaling_variants(rope_scaling):
    hf = make_tiny_hf_model("llama", rope_scaling=rope_scaling)
    ours = load_model(hf, max_positions=64)
    prompt = list(range(3, 40))
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(_full_prefill_logits(ours, [prompt])[0], expected, atol=1e-4, rtol=1e-4)


def test_engine_model_loads_from_a_safetensors_folder(tmp_path):
    hf = make_tiny_hf_model("qwen3")
    hf.save_pretrained(tmp_path)
    ours = load_model(str(tmp_path), max_positions=32)
    with torch.no_grad():
        expected = hf(torch.tensor([[3, 4, 5]])).logits[0]
    torch.testing.assert_close(_full_prefill_logits(ours, [[3, 4, 5]])[0], expected, atol=1e-4, rtol=1e-4)


def test_a_tp_rank_reads_only_its_slice_of_each_weight_from_a_safetensors_folder(tmp_path):
    make_tiny_hf_model("llama", vocab_size=95).save_pretrained(tmp_path)
    full = dict(iter_safetensors(str(tmp_path)))
    for rank in (0, 1):
        args = DecoderArgs.from_hf(make_tiny_hf_model("llama", vocab_size=95).config, "llama", 32).sharded(2, rank)
        own = {name: (tp_weight_slices(args, name) or [None, None])[rank] for name in full}
        read = dict(iter_safetensors(str(tmp_path), slice_of=own.get))
        assert read.keys() == full.keys() and any(piece is not None for piece in own.values())
        for name, tensor in full.items():
            expected = tensor if own[name] is None else own[name].take(tensor)
            assert torch.equal(read[name], expected), name


def test_unknown_architecture_is_reported_unsupported():
    hf = make_tiny_hf_model("llama")
    hf.config.architectures = ["GPT2LMHeadModel"]
    hf.config.model_type = "gpt2"
    assert not is_supported(hf.config)
    with pytest.raises(ValueError, match=r"rollout\.name=hf"):
        load_model(hf)
