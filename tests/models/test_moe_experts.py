"""How a mixture-of-experts model computes its experts in training: the implementation hyflow asks transformers
for (grouped GEMMs, never the per-expert Python loop unless asked), and that it equals the eager loop."""

import pytest
import torch

from hyflow.config.common import FSDPConfig, ModelConfig
from hyflow.models.loader import load_causal_lm
from hyflow.models.policy import PolicyModel
from hyflow.models.tiny import build_tiny_model
from hyflow.workers.builders import policy_maker


@pytest.fixture(scope="module")
def moe_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("experts")
    return {arch: build_tiny_model(root / arch, arch=arch, hidden_size=32) for arch in ("qwen3_moe", "mixtral")}


def test_moe_models_load_with_grouped_mm_experts_by_default_empty_or_not(moe_paths):
    for path in moe_paths.values():
        assert load_causal_lm(path).config._experts_implementation == "grouped_mm"
        assert load_causal_lm(path, empty_weights=True).config._experts_implementation == "grouped_mm"


def test_model_config_experts_implementation_reaches_the_training_model(moe_paths):
    model_config = ModelConfig(path=moe_paths["qwen3_moe"], experts_implementation="eager")
    _, hf_model = policy_maker(model_config, FSDPConfig(), model_config.path, trainable=True)(False)
    assert hf_model.config._experts_implementation == "eager"


def test_dense_models_ignore_experts_implementation(tmp_path):
    path = build_tiny_model(tmp_path / "dense", arch="qwen2", hidden_size=32)
    assert load_causal_lm(path, experts_implementation="grouped_mm").config.model_type == "qwen2"


def log_probs_and_grads(path, experts_implementation):
    policy = PolicyModel(load_causal_lm(path, experts_implementation=experts_implementation))
    input_ids = torch.randint(3, 500, (3, 10), generator=torch.Generator().manual_seed(0))
    position_ids = torch.arange(10).expand(3, 10)
    log_probs, _ = policy(input_ids, torch.ones_like(input_ids), position_ids, input_ids[:, -4:])
    log_probs.sum().backward()
    return log_probs.detach(), {name: p.grad for name, p in policy.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm"])
@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_grouped_experts_give_the_eager_loops_log_probs_and_gradients(moe_paths, arch, implementation):
    eager_log_probs, eager_grads = log_probs_and_grads(moe_paths[arch], "eager")
    log_probs, grads = log_probs_and_grads(moe_paths[arch], implementation)
    torch.testing.assert_close(log_probs, eager_log_probs, rtol=1e-5, atol=1e-5)
    assert grads.keys() == eager_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)
