"""verl's rollout-correction API (`verl.trainer.ppo.rollout_corr_helper`) on `hyflow.algorithms.rollout_correction`.

    weights, response_mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob, rollout_log_prob, response_mask, rollout_is="token", rollout_is_threshold=2.0,
        rollout_rs="seq_mean_k1", rollout_rs_threshold="0.999_1.001")

The weights and masks are hyflow's (`rollout_is_weights`, `rejection_mask`; formulas there), plus verl's IcePop:
a `"lower_upper"` IS threshold zeroes the weights whose ratio is outside [lower, upper] instead of truncating them
(Ling team 2025, "IcePop"). The metrics are verl's diagnostics, under its names (`rollout_corr/...`), with
r_t = π_old / π_rollout of each sampled token, m the response mask and ρ_i = Π_t r_t:

    kl = E_m[log π_rollout − log π_old]       k3_kl = E_m[r − 1 − log r]
    training_ppl = mean_i exp(−E_t[log π_old])   (rollout_ppl likewise; log_ppl_diff = E_t[log π_rollout − log π_old])
    chi2_token = E_m[r²] − 1                   chi2_seq = mean_i ρ_i² − 1      (log-ratios bounded to ±20)
    rollout_is_eff_sample_size = 1 / E_m[(w / E_m[w])²]

Rejection options bound π_old / π_rollout itself for k1 (`lower ≤ r ≤ upper`, as verl's documentation states);
verl 0.9's code bounds its inverse, which differs only for asymmetric bounds. Metrics are floats, read from the
device in one transfer.

Shape legend: B = responses, T = response length.
"""

from __future__ import annotations

import math

import torch

from hyflow.algorithms.masked import masked_mean
from hyflow.algorithms.rollout_correction import (
    LOG_RATIO_BOUND,
    RS_OPTIONS,
    parse_is_threshold,
    parse_rejection_rules,
    rejection_mask,
    rejection_statistic,
    rollout_is_weights,
)
from hyflow.protocol import DataProto

__all__ = [
    "SUPPORTED_ROLLOUT_RS_OPTIONS",
    "compute_is_metrics",
    "compute_offpolicy_metrics",
    "compute_rollout_correction_and_rejection_mask",
]

SUPPORTED_ROLLOUT_RS_OPTIONS: frozenset[str] = frozenset(RS_OPTIONS)
PREFIX = "rollout_corr/"


def _floats(metrics: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """The metrics as Python floats, the tensors read in one device-to-host copy."""
    names = [name for name, value in metrics.items() if isinstance(value, torch.Tensor)]
    values = torch.stack([metrics[name].detach().float().reshape(()) for name in names]).tolist() if names else []
    return {**metrics, **dict(zip(names, values, strict=True))}


def compute_is_metrics(
    rollout_is_weights: torch.Tensor,
    raw_rollout_is_weights: torch.Tensor,
    log_ratio_for_metrics: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str,
    rollout_is_threshold: float,
    rollout_is_threshold_lower: float | None = None,
) -> dict[str, float]:
    """verl's IS-weight diagnostics (unprefixed): the applied weights' mean, max, min, std and effective sample
    size; the fractions of raw ratios above / below the bounds (lower default 1/upper); per-response means.
    `log_ratio_for_metrics` is (B, T) at token level, the per-response sums (B, 1) at sequence level."""
    mask = response_mask.to(rollout_is_weights.dtype)
    upper = rollout_is_threshold
    lower = 1.0 / upper if rollout_is_threshold_lower is None else rollout_is_threshold_lower
    metrics: dict[str, torch.Tensor | float] = {"rollout_is_mean": masked_mean(rollout_is_weights, mask)}
    if rollout_is == "sequence":
        metrics["rollout_is_max"] = torch.exp(log_ratio_for_metrics.max().clamp(max=LOG_RATIO_BOUND))
        metrics["rollout_is_min"] = torch.exp(log_ratio_for_metrics.min())
        metrics["rollout_is_ratio_fraction_high"] = (log_ratio_for_metrics > math.log(upper)).float().mean()
        metrics["rollout_is_ratio_fraction_low"] = (log_ratio_for_metrics < math.log(lower)).float().mean()
    else:
        metrics["rollout_is_max"] = rollout_is_weights.masked_fill(~mask.bool(), -math.inf).max()
        metrics["rollout_is_min"] = rollout_is_weights.masked_fill(~mask.bool(), math.inf).min()
        metrics["rollout_is_ratio_fraction_high"] = masked_mean((raw_rollout_is_weights > upper).to(mask), mask)
        metrics["rollout_is_ratio_fraction_low"] = masked_mean((raw_rollout_is_weights < lower).to(mask), mask)
    bounded = rollout_is_weights.clamp(min=0.0, max=upper)
    mean = masked_mean(bounded, mask)
    variance = masked_mean(bounded.square(), mask) - mean.square()
    metrics["rollout_is_std"] = variance.clamp_min(0.0).sqrt() if mask.sum() > 1 else 0.0
    metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean((bounded / (mean + 1e-8)).square(), mask)
    counts = mask.sum(dim=-1).clamp_min(1.0)
    seq_mean = (rollout_is_weights * mask).sum(dim=-1) / counts
    raw_seq_mean = (raw_rollout_is_weights * mask).sum(dim=-1) / counts
    metrics["rollout_is_seq_mean"] = seq_mean.mean()
    metrics["rollout_is_seq_std"] = seq_mean.std() if seq_mean.numel() > 1 else 0.0
    metrics["rollout_is_seq_max"] = seq_mean.max()
    metrics["rollout_is_seq_min"] = seq_mean.min()
    metrics["rollout_is_seq_max_deviation"] = (seq_mean - 1.0).abs().max()
    metrics["rollout_is_seq_fraction_high"] = (raw_seq_mean > upper).float().mean()
    metrics["rollout_is_seq_fraction_low"] = (raw_seq_mean < lower).float().mean()
    return _floats(metrics)


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, float]:
    """verl's off-policy diagnostics (unprefixed; formulas in the module docstring). Without rollout log-probs
    only the training policy's perplexity."""
    mask = response_mask.to(old_log_prob.dtype)
    if not mask.any():
        raise ValueError("compute_offpolicy_metrics: response_mask has no response token to measure.")
    counts = mask.sum(dim=-1).clamp_min(1.0)
    old_mean = (old_log_prob * mask).sum(dim=-1) / counts  # (B,) mean log-prob of each response
    metrics: dict[str, torch.Tensor | float] = {
        "training_ppl": torch.exp(-old_mean).mean(),
        "training_log_ppl": (-old_mean).mean(),
    }
    if rollout_log_prob is not None:
        log_ratio = old_log_prob - rollout_log_prob
        rollout_mean = (rollout_log_prob * mask).sum(dim=-1) / counts
        log_ppl_diff = rollout_mean - old_mean
        bounded = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        seq_log_ratio = (log_ratio * mask).sum(dim=-1).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        metrics |= {
            "kl": masked_mean(-log_ratio, mask),
            "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1.0, mask),
            "rollout_ppl": torch.exp(-rollout_mean).mean(),
            "rollout_log_ppl": (-rollout_mean).mean(),
            "log_ppl_diff": log_ppl_diff.mean(),
            "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
            "log_ppl_diff_max": log_ppl_diff.max(),
            "log_ppl_diff_min": log_ppl_diff.min(),
            "ppl_ratio": torch.exp(log_ppl_diff).mean(),
            "chi2_token": masked_mean(torch.exp(bounded).square(), mask) - 1.0,
            "chi2_seq": torch.exp(2.0 * seq_log_ratio).mean() - 1.0,
        }
    return _floats(metrics)


def _is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    threshold: str | float,
    batch_normalize: bool,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The IS weights (TIS, or IcePop for a 'lower_upper' threshold: `rollout_is_weights`) and their metrics."""
    if level not in ("token", "sequence"):
        raise ValueError(f"rollout_is={level!r} is not a level; use 'token', 'sequence' or None.")
    upper, lower = parse_is_threshold(threshold)
    raw = rollout_is_weights(old_log_prob, rollout_log_prob, response_mask, level, threshold=math.inf)
    weights = rollout_is_weights(old_log_prob, rollout_log_prob, response_mask, level, threshold, batch_normalize)
    log_ratio = (old_log_prob - rollout_log_prob) * response_mask
    log_ratio_for_metrics = log_ratio if level == "token" else log_ratio.sum(dim=-1, keepdim=True)
    metrics = compute_is_metrics(weights, raw, log_ratio_for_metrics, response_mask, level, upper, lower)
    if lower is not None:
        outside = ((raw < lower) | (raw > upper)).to(old_log_prob.dtype)
        metrics |= _floats({"rollout_is_oob_ratio": masked_mean(outside, response_mask.to(outside))})
    return weights, metrics


def _rejection(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    options: str,
    thresholds: str | float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The response mask with rejected tokens / responses zeroed, and per-option statistics and fractions."""
    if thresholds is None:
        raise ValueError(f"rollout_rs={options!r} needs rollout_rs_threshold. Fix: set it, e.g. '0.5_2.0' for k1.")
    rules = parse_rejection_rules(options, thresholds)
    mask = response_mask.to(old_log_prob.dtype)
    valid = mask.bool()
    log_ratio = (old_log_prob - rollout_log_prob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND) * mask
    metrics: dict[str, torch.Tensor | float] = {}
    for rule in rules:
        statistic = rejection_statistic(log_ratio, mask, rule.option).expand_as(mask)
        kept = rejection_mask(old_log_prob, rollout_log_prob, response_mask, [rule]).bool()
        name = f"rollout_rs_{rule.option}"
        metrics[f"{name}_mean"] = masked_mean(statistic, mask)
        metrics[f"{name}_max"] = statistic.masked_fill(~valid, -math.inf).max()
        metrics[f"{name}_min"] = statistic.masked_fill(~valid, math.inf).min()
        metrics[f"{name}_masked_fraction"] = masked_mean((~kept).to(mask), mask)
        metrics[f"{name}_seq_masked_fraction"] = (valid & ~kept).any(dim=-1).float().mean()
    final = rejection_mask(old_log_prob, rollout_log_prob, response_mask, rules)
    metrics["rollout_rs_masked_fraction"] = masked_mean((~final.bool()).to(mask), mask)
    metrics["rollout_rs_seq_masked_fraction"] = (valid & ~final.bool()).any(dim=-1).float().mean()
    return final, _floats(metrics)


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[DataProto | None, torch.Tensor, dict[str, float]]:
    """IS weights (a DataProto holding `rollout_is_weights` (B, T), or None when `rollout_is` is None), the
    response mask after rejection sampling (B, T), and every metric with the `rollout_corr/` prefix."""
    if not response_mask.any():
        raise ValueError("response_mask has no response token (all zeros); nothing to correct.")
    if not old_log_prob.shape == rollout_log_prob.shape == response_mask.shape:
        raise ValueError(
            f"old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob {tuple(rollout_log_prob.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have one shape (B, T)."
        )
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = _is_weights(
            old_log_prob, rollout_log_prob, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics |= is_metrics
    kept_mask = response_mask.clone()
    if rollout_rs is not None:
        kept_mask, rs_metrics = _rejection(
            old_log_prob, rollout_log_prob, response_mask, rollout_rs, rollout_rs_threshold
        )
        metrics |= rs_metrics
    metrics |= compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask)
    weights_proto = None if weights is None else DataProto.from_dict(tensors={"rollout_is_weights": weights})
    return weights_proto, kept_mask, {PREFIX + name: value for name, value in metrics.items()}
