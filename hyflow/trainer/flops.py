"""FLOPs and model-FLOPs-utilisation (MFU) estimates for a decoder-only transformer.

The count follows Kaplan et al. 2020 (arXiv:2001.08361, Sec. 2.1) and PaLM (Chowdhery et al. 2022,
arXiv:2204.02311, Appendix B). For N parameters (embeddings excluded, the LM head included), L layers, attention
width d = heads · head_dim and sequences of lengths s_i:

    forward   FLOPs ≈ 2 · N · Σ s_i  +  4 · L · d · Σ s_i²      (matmul weights; QKᵀ and A·V)
    training  FLOPs ≈ 3 × forward = 6 · N · Σ s_i + 12 · L · d · Σ s_i²   (backward costs twice the forward)

The attention term counts the full s × s score matrix (no causal halving), as PaLM does. Generation with a KV
cache does the forward work once per token, so its FLOPs are the forward formula over the final lengths.

    MFU = FLOPs / (seconds · n_devices · peak FLOP/s of one device)

The peak is the dense bf16 tensor-core figure from the vendor's data sheet (`PEAK_BF16_FLOPS`); on a device not
in the table (a CPU included) the MFU is not reported.

    flops = estimate_flops(model_config, seq_lens, training=True)
    mfu = compute_mfu(flops, seconds, n_devices, device_peak_flops(torch.cuda.get_device_name()))
    # or, for every timed stage of a step at once (perf/mfu/gen, perf/mfu/update_actor, ...):
    metrics.update(compute_mfu_metrics(model_config, seq_lens, timing, n_devices, peak_flops))
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "PEAK_BF16_FLOPS",
    "compute_mfu",
    "compute_mfu_metrics",
    "device_peak_flops",
    "estimate_flops",
    "estimate_num_params",
]

logger = logging.getLogger(__name__)

# Stages that run the model forward only, and those that also run it backward (training).
FORWARD_STAGES = ("gen", "old_log_prob", "ref", "values")
TRAINING_STAGES = ("update_actor", "update_critic")

# Dense bf16 peak FLOP/s per device, matched by substring of torch.cuda.get_device_name() (first match wins).
PEAK_BF16_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "H20": 148e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L40": 181e12,
    "A10": 125e12,
    "L4": 121e12,
    "4090": 165e12,
    "3090": 71e12,
    "V100": 125e12,
    "MI300X": 1307e12,
}


def _attention_width(config: Any) -> tuple[int, int]:
    """(query width heads·head_dim, key/value width kv_heads·head_dim) of a Hugging Face decoder config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return heads * head_dim, kv_heads * head_dim


def _decoder_config(config: Any) -> Any:
    """The language model's config: a vision-language config's `text_config` (its vision tower is not counted),
    the config itself for a decoder."""
    get_text_config = getattr(config, "get_text_config", None)
    return get_text_config(decoder=True) if get_text_config is not None else config


def estimate_num_params(config: Any) -> int:
    """Non-embedding parameters of a Llama/Qwen-style decoder, from its Hugging Face config (of a vision-language
    model: its language model's).

    Per layer: attention projections h·q + 2·h·kv + q·h, gated MLP 3·h·i, two norms 2·h; plus the final norm and
    the LM head V·h (the head does matmul work even when it is tied to the input embedding).
    """
    config = _decoder_config(config)
    hidden = config.hidden_size
    query_width, kv_width = _attention_width(config)
    attention = hidden * query_width + 2 * hidden * kv_width + query_width * hidden
    mlp = 3 * hidden * config.intermediate_size
    per_layer = attention + mlp + 2 * hidden
    return config.num_hidden_layers * per_layer + hidden + config.vocab_size * hidden


def estimate_flops(config: Any, seq_lens: Sequence[int], training: bool = True) -> float:
    """FLOPs to process sequences of `seq_lens` tokens once (see the module docstring for the formula)."""
    config = _decoder_config(config)
    num_params = estimate_num_params(config)
    query_width, _ = _attention_width(config)
    tokens = float(sum(seq_lens))
    squares = float(sum(s * s for s in seq_lens))
    forward = 2.0 * num_params * tokens + 4.0 * config.num_hidden_layers * query_width * squares
    return 3.0 * forward if training else forward


def device_peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the device named `device_name`, or None when it is not in `PEAK_BF16_FLOPS`."""
    for key, peak in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return peak
    logger.debug("no peak FLOP/s known for device %r; MFU will not be reported", device_name)
    return None


def compute_mfu(flops: float, seconds: float, n_devices: int, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation: flops / (seconds · n_devices · peak_flops); None when the peak is unknown."""
    if peak_flops is None or seconds <= 0 or n_devices < 1:
        return None
    return flops / (seconds * n_devices * peak_flops)


def compute_mfu_metrics(
    config: Any,
    seq_lens: Sequence[int],
    timing: Mapping[str, float],
    n_devices: int,
    peak_flops: float | None,
    ppo_epochs: int = 1,
) -> dict[str, float]:
    """`perf/mfu/<stage>` for every timed model stage, from the batch's sequence lengths (prompt + response).

    `gen`, `old_log_prob`, `ref` and `values` count one forward pass over the batch; `update_actor` and
    `update_critic` count `ppo_epochs` training passes. All stages use `config` (the actor's architecture).
    Empty when the device's peak is unknown (`peak_flops=None`, e.g. on a CPU).
    """
    if peak_flops is None:
        return {}
    forward = estimate_flops(config, seq_lens, training=False)
    metrics = {}
    for stage, seconds in timing.items():
        if stage in FORWARD_STAGES:
            flops = forward
        elif stage in TRAINING_STAGES:
            flops = 3.0 * forward * ppo_epochs
        else:
            continue
        mfu = compute_mfu(flops, seconds, n_devices, peak_flops)
        if mfu is not None:
            metrics[f"perf/mfu/{stage}"] = mfu
    return metrics
