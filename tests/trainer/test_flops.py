"""FLOPs and MFU estimates, checked against a real tiny model's parameter count and the written formula."""

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from hyflow.trainer.flops import (
    compute_mfu,
    compute_mfu_metrics,
    device_peak_flops,
    estimate_flops,
    estimate_num_params,
)


def _config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )


def test_num_params_equals_the_tiny_models_count_without_the_input_embedding():
    config = _config()
    model = LlamaForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    embedding = config.vocab_size * config.hidden_size
    assert estimate_num_params(config) == total - embedding


def test_training_flops_are_three_forwards_with_a_quadratic_attention_term():
    config = _config()
    n = estimate_num_params(config)
    lens = [3, 7]
    forward = 2 * n * 10 + 4 * config.num_hidden_layers * config.hidden_size * (9 + 49)
    assert estimate_flops(config, lens, training=False) == pytest.approx(forward)
    assert estimate_flops(config, lens, training=True) == pytest.approx(3 * forward)


def test_mfu_divides_by_device_time_and_peak():
    assert compute_mfu(4e12, seconds=2.0, n_devices=2, peak_flops=1e12) == pytest.approx(1.0)
    assert compute_mfu(4e12, seconds=2.0, n_devices=2, peak_flops=None) is None


def test_peak_flops_are_known_for_datacenter_gpus_and_unknown_for_a_cpu():
    assert device_peak_flops("NVIDIA H200") == 989e12
    assert device_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert device_peak_flops("NVIDIA A10G") == 125e12
    assert device_peak_flops("cpu") is None


def test_mfu_metrics_count_a_forward_for_inference_stages_and_epochs_of_training_for_updates():
    config = _config()
    lens = [5, 9]
    timing = {"gen": 2.0, "update_actor": 3.0, "reward": 1.0}
    metrics = compute_mfu_metrics(config, lens, timing, n_devices=2, peak_flops=1e9, ppo_epochs=2)
    forward = estimate_flops(config, lens, training=False)
    assert metrics["perf/mfu/gen"] == pytest.approx(forward / (2.0 * 2 * 1e9))
    assert metrics["perf/mfu/update_actor"] == pytest.approx(3 * forward * 2 / (3.0 * 2 * 1e9))
    assert "perf/mfu/reward" not in metrics
    assert compute_mfu_metrics(config, lens, timing, n_devices=2, peak_flops=None) == {}


def test_a_vision_language_config_is_counted_by_its_language_model():
    from hyflow.models.tiny_vlm import build_tiny_vlm_tokenizer, tiny_vlm_config

    config = tiny_vlm_config(build_tiny_vlm_tokenizer(), arch="qwen2_5_vl")
    text = config.get_text_config()
    assert estimate_num_params(config) == estimate_num_params(text) > 0
    assert estimate_flops(config, [32, 16]) == estimate_flops(text, [32, 16])
