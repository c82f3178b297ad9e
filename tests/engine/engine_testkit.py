"""Test kit for the engine tests: tiny Hugging Face models of each decoder family, built from config with a fixed
seed (nothing downloaded), the `transformers` greedy reference, and the engine's outputs compared run against run."""

from __future__ import annotations

import importlib.util
import itertools
import os

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from hyflow.models.tiny import peak_weights

# Triton kernel tests run on CUDA, or on the CPU under Triton's interpreter (TRITON_INTERPRET=1 with triton
# installed); CI's CPU machine has no Triton, so they skip there.
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None
    or not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
    reason="needs Triton and CUDA (or TRITON_INTERPRET=1)",
)

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM),
    "mixtral": (MixtralConfig, MixtralForCausalLM),
}
# Mixture-of-experts sizes: 4 experts, 2 per token; Qwen2-MoE with its shared expert, Qwen3-MoE with one dense layer
# (mlp_only_layers) so both kinds of layer run.
MOE_SIZES = {
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[1]),
    "qwen2_moe": dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48
    ),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
}


def make_tiny_hf_model(family: str = "qwen2", seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny randomly initialised `transformers` causal LM (fp32, eval mode) of one family."""
    config_cls, model_cls = FAMILIES[family]
    kwargs = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=family == "qwen2",
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if family in ("qwen3", "qwen3_moe"):
        kwargs["head_dim"] = 16
    kwargs.update(MOE_SIZES.get(family, {}))
    kwargs.update(overrides)
    config = config_cls(**kwargs)
    config.architectures = [model_cls.__name__]
    torch.manual_seed(seed)
    return peak_weights(model_cls(config).eval(), seed)


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by `transformers.generate` (the reference)."""
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        min_new_tokens=max_new_tokens,
    )
    return out[0, len(prompt) :].tolist()


def engine_outputs(engine, prompts: list[list[int]], params) -> list[list[tuple]]:
    """`engine.generate`'s outputs per request, per sample: (token ids, finish reason, log-probs, raw log-probs)."""
    return [
        [(o.token_ids, o.finish_reason, o.log_probs, o.raw_log_probs) for o in request.outputs]
        for request in engine.generate(prompts, params)
    ]


def assert_same_outputs(actual: list[list[tuple]], expected: list[list[tuple]]) -> None:
    """Equal tokens and finish reasons, log-probs (and raw ones, when expected) equal to 1e-5."""
    assert [[s[:2] for s in r] for r in actual] == [[s[:2] for s in r] for r in expected]
    for actual_request, expected_request in zip(actual, expected):
        for (_, _, log_probs, raw), (_, _, expected_log_probs, expected_raw) in zip(actual_request, expected_request):
            torch.testing.assert_close(torch.tensor(log_probs), torch.tensor(expected_log_probs), atol=1e-5, rtol=1e-5)
            if expected_raw is not None:
                torch.testing.assert_close(torch.tensor(raw), torch.tensor(expected_raw), atol=1e-5, rtol=1e-5)


def rescore(
    models: dict[int, torch.nn.Module], prompt: list[int], tokens: list[int], versions: list[int]
) -> tuple[torch.Tensor, list[int]]:
    """A full forward of prompt + tokens under the weights of each token's version: at each token, its log-prob
    (log_softmax: temperature 1, no filters) and the greedy choice (argmax) for that position. `models[v]` holds
    the weights of version v = 0, 1, ..."""
    assert list(models) == list(range(len(models))), "models must map versions 0, 1, ... in order"
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():  # (num versions, num tokens, V)
        log_probs = torch.stack(
            [model(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1) for model in models.values()]
        )
    per_token = log_probs[torch.tensor(versions), torch.arange(len(tokens))]  # (num tokens, V)
    return per_token.gather(1, torch.tensor(tokens)[:, None])[:, 0], per_token.argmax(-1).tolist()


def pause_after_steps(engine, num_steps: int) -> None:
    """Makes the engine pause itself at the end of its `num_steps`-th step from now: a step boundary that does not
    depend on timing, for tests that load weights while an async step loop runs (they wait for `engine.paused`)."""
    step, count = engine.step, itertools.count(1)

    def counted_step():
        finished = step()
        if next(count) == num_steps:
            engine.pause()
        return finished

    engine.step = counted_step
