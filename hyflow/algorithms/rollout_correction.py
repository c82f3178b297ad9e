"""Rollout correction: importance weights and rejection masks for tokens sampled by a different policy.

Shape legend: B = responses, T = response length. Inputs are per-token log-probs (B, T) of the same sampled
tokens under two policies and the `response_mask` (B, T). With log r_t = log π_target(t) − log π_behaviour(t):

- the behaviour policy is the one that generated the tokens: the engine's `rollout_log_probs` (its weights may be
  older, its numerics different: bf16 kernels, another attention implementation);
- the target is π_old (the decoupled PPO objective: PPO's ratio is taken against π_old, and the IS weight corrects
  π_rollout → π_old) or π_θ itself (bypass mode: π_old = π_rollout).

IS weights (truncated importance sampling, TIS; Yao et al. 2025 "Your efficient RL framework secretly brings you
off-policy RL training"; Liu, Li et al. 2025 "When speed kills stability"):

    token:     w_t = min(exp(log r_t), C)
    sequence:  w_t = min(exp(Σ_s m_s · log r_s), C)      (the same weight on every token of the response)

with log-ratios bounded to ±20 before the exponent, C = `threshold`, and w = 0 on padding. A threshold
`"L_C"` masks instead of truncating (masked IS, IcePop: Ling Team 2025, "Every Step Evolves: Scaling Reinforcement
Learning for Trillion-Scale Thinking Model"; verl's `rollout_is_threshold="lower_upper"`):

    token:     w_t = r_t · 1[L ≤ r_t ≤ C]                (a token whose ratio leaves the band adds 0 to the loss)
    sequence:  w_t = ρ · 1[L ≤ ρ ≤ C],  ρ = exp(Σ_s m_s · log r_s)

so a token on which the two policies disagree by more than the band allows gets no gradient at all, where TIS would
still push it with weight C. Rejection sampling
(masked IS, MIS) drops whole tokens or responses whose divergence is out of bounds, with the per-token estimators
k1 = −log r (bounds on r itself: lower ≤ r ≤ upper), k2 = ½ (log r)², k3 = r − 1 − log r, aggregated per response
by sum, mean or max. These are the `algorithm.rollout_correction.*` options verl uses, under the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from hyflow.algorithms.masked import masked_mean

__all__ = [
    "RejectionRule",
    "correction_metrics",
    "parse_is_threshold",
    "parse_rejection_rules",
    "rejection_mask",
    "rejection_statistic",
    "rollout_is_weights",
    "threshold_hits",
]

LOG_RATIO_BOUND = 20.0  # exp(±20) ≈ 5e8 / 2e-9: the weights stay finite in fp32
RS_OPTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip


def parse_is_threshold(threshold: float | str) -> tuple[float, float | None]:
    """(C, L) of an IS threshold: a number C truncates the weights at C (TIS; L is None), a string `"L_C"` zeroes
    the weights whose ratio lies outside [L, C] (IcePop). A number given as a string ("2.0") is a number."""
    key = "algorithm.rollout_correction.rollout_is_threshold"
    if isinstance(threshold, bool) or not isinstance(threshold, int | float | str):
        raise TypeError(
            f"{key}={threshold!r} is a {type(threshold).__name__}. Fix: give a number (e.g. 2.0: truncated IS) or a "
            "'lower_upper' string (e.g. '0.5_5.0': IcePop)."
        )
    try:
        bounds = [float(part) for part in str(threshold).strip().split("_")]
    except ValueError:
        bounds = []
    if len(bounds) == 1 and bounds[0] > 0:
        return bounds[0], None
    if len(bounds) == 1:
        raise ValueError(
            f"{key}={threshold!r} must be positive (it is the upper bound C of the IS weight). Fix: set it above 0, "
            "e.g. 2.0 (verl's default), or give 'lower_upper' bounds such as '0.5_5.0' (IcePop)."
        )
    if len(bounds) != 2 or not 0 < bounds[0] <= bounds[1]:
        raise ValueError(
            f"{key}={threshold!r} is neither a positive number nor 'lower_upper' bounds with 0 < lower <= upper. "
            "Fix: use e.g. 2.0 (truncated IS) or '0.5_5.0' (IcePop: the weights of ratios outside the band are 0)."
        )
    return bounds[1], bounds[0]


def rollout_is_weights(
    target_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    level: Literal["token", "sequence"],
    threshold: float | str,
    batch_normalize: bool = False,
) -> torch.Tensor:
    """IS weights (B, T) of π_target / π_behaviour, truncated at a number `threshold` C (TIS) or masked outside the
    band of a `"L_C"` threshold (IcePop); formulas in the module docstring.

    `batch_normalize` rescales the weights to mean 1 over the batch's tokens (token level) or over its responses
    (sequence level), after truncation or masking.
    """
    upper, lower = parse_is_threshold(threshold)
    mask = response_mask.to(target_log_probs.dtype)
    log_ratio = (target_log_probs - behaviour_log_probs) * mask
    if level == "token":
        weights = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    elif level == "sequence":
        seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        weights = torch.exp(seq_log_ratio).expand_as(log_ratio)
    else:
        raise ValueError(
            f"algorithm.rollout_correction.rollout_is={level!r} is not a level; use 'token', 'sequence' or null."
        )
    if lower is None:
        weights = weights.clamp(max=upper)
    else:
        weights = torch.where((weights >= lower) & (weights <= upper), weights, torch.zeros_like(weights))
    weights = weights * mask
    if batch_normalize:
        if level == "token":
            mean = masked_mean(weights, mask)
        else:
            has_tokens = mask.sum(dim=-1) > 0
            mean = weights.max(dim=-1).values[has_tokens].mean()
        weights = weights / mean.clamp_min(1e-8)
    return weights.detach()


def threshold_hits(log_ratio: torch.Tensor, threshold: float | str) -> torch.Tensor:
    """Where an IS threshold acts on a token's ratio r = exp(log_ratio) (B, T bool): r > C for a number C (TIS
    truncates it), r outside [L, C] for `"L_C"` (IcePop zeroes it)."""
    upper, lower = parse_is_threshold(threshold)
    ratio = torch.exp(log_ratio)
    return ratio > upper if lower is None else (ratio < lower) | (ratio > upper)


@dataclass(frozen=True)
class RejectionRule:
    """One rejection option: where it aggregates (`token`, `seq_sum`, `seq_mean`, `seq_max`), which estimator
    (`k1`, `k2`, `k3`), and its bounds (k1: lower ≤ r ≤ upper on the ratio; k2/k3: divergence ≤ upper)."""

    option: str
    lower: float | None
    upper: float


def parse_rejection_rules(options: str, thresholds: str | float) -> list[RejectionRule]:
    """verl's spelling: `rollout_rs="token_k1,seq_max_k2"`, `rollout_rs_threshold="0.5_2.0,0.1"` (one entry per
    option, or one for all). A k1 threshold is `"lower_upper"`, or one float `u` meaning [1/u, u]."""
    names = [name.strip() for name in str(options).split(",") if name.strip()]
    entries = [entry.strip() for entry in str(thresholds).split(",") if entry.strip()]
    unknown = [name for name in names if name not in RS_OPTIONS]
    if unknown or not names:
        raise ValueError(
            f"algorithm.rollout_correction.rollout_rs={options!r}: unknown option(s) {unknown}. Allowed values: "
            f"{list(RS_OPTIONS)} (comma-separated)."
        )
    if len(entries) not in (1, len(names)):
        raise ValueError(
            f"algorithm.rollout_correction.rollout_rs_threshold={thresholds!r} has {len(entries)} entries for "
            f"{len(names)} option(s); give one per option or one for all."
        )
    rules = []
    for name, entry in zip(names, entries * len(names) if len(entries) == 1 else entries):
        try:
            bounds = [float(part) for part in entry.split("_")]
        except ValueError:
            bounds = []
        ratio = name.endswith("k1")
        valid = (len(bounds) == 2 and ratio and 0 <= bounds[0] < bounds[1]) or (len(bounds) == 1 and bounds[0] > 0)
        if not valid:
            raise ValueError(
                f"algorithm.rollout_correction.rollout_rs_threshold entry {entry!r} for {name}: "
                + ("use 'lower_upper' ratio bounds (e.g. '0.5_2.0') or one upper bound u > 0 (meaning [1/u, u])."
                   if ratio else "use one positive upper bound on the divergence (e.g. 0.1).")
            )  # fmt: skip
        if ratio:
            lower, upper = (bounds[0], bounds[1]) if len(bounds) == 2 else (1.0 / bounds[0], bounds[0])
        else:
            lower, upper = None, bounds[0]
        rules.append(RejectionRule(name, lower, upper))
    return rules


def _divergence(log_ratio: torch.Tensor, estimator: str) -> torch.Tensor:
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    return torch.exp(log_ratio) - 1.0 - log_ratio  # k3


def rejection_statistic(log_ratio: torch.Tensor, mask: torch.Tensor, option: str) -> torch.Tensor:
    """What a rejection option bounds: its estimator (k1, k2, k3 of the bounded log r) per token (B, T) for
    `token_*` options, or aggregated over each response's tokens (B, 1) by sum, mean or max (−inf for a
    response without tokens)."""
    where, _, estimator = option.rpartition("_")
    value = _divergence(log_ratio, estimator) * mask
    if where == "token":
        return value
    if where == "seq_sum":
        return value.sum(dim=-1, keepdim=True)
    if where == "seq_mean":
        return value.sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp_min(1.0)
    return value.masked_fill(~mask.bool(), float("-inf")).max(dim=-1, keepdim=True).values  # seq_max


def rejection_mask(
    target_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    rules: list[RejectionRule],
) -> torch.Tensor:
    """The response mask (B, T) with rejected tokens (token rules) and responses (sequence rules) set to 0."""
    mask = response_mask.to(target_log_probs.dtype)
    log_ratio = (target_log_probs - behaviour_log_probs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND) * mask
    keep = mask.bool()
    for rule in rules:
        estimator = rule.option.rpartition("_")[2]
        value = rejection_statistic(log_ratio, mask, rule.option)
        if estimator == "k1":  # bounds on the ratio r = exp(−k1)
            ratio = torch.exp(-value)
            inside = (ratio >= rule.lower) & (ratio <= rule.upper)
        else:
            inside = value <= rule.upper
        keep = keep & inside.expand_as(keep)
    return keep.to(response_mask.dtype)


def correction_metrics(
    target_log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    weights: torch.Tensor | None,
    kept_mask: torch.Tensor | None,
    threshold: float | str | None,
) -> dict[str, torch.Tensor]:
    """How far the behaviour policy is from the target, and what the correction did (0-d tensors, no host sync):

    `rollout_corr/kl_k1` = mean −log r and `kl_k3` = mean (r − 1 − log r) over response tokens (estimates of
    KL(behaviour ‖ target)); `is_weight_{mean,max}`, `is_clipped_fraction` (tokens whose raw ratio the threshold
    acted on, at token level: above C with TIS, outside [L, C] with IcePop); `rejected_token_fraction`.
    """
    mask = response_mask.to(target_log_probs.dtype)
    log_ratio = (target_log_probs - behaviour_log_probs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    metrics = {
        "rollout_corr/kl_k1": masked_mean(-log_ratio, mask),
        "rollout_corr/kl_k3": masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask),
    }
    if weights is not None:
        metrics["rollout_corr/is_weight_mean"] = masked_mean(weights, mask)
        metrics["rollout_corr/is_weight_max"] = (weights * mask).max()
        if threshold is not None:
            hits = threshold_hits(log_ratio, threshold)
            metrics["rollout_corr/is_clipped_fraction"] = masked_mean(hits.to(mask), mask)
    if kept_mask is not None:
        metrics["rollout_corr/rejected_token_fraction"] = 1.0 - kept_mask.to(mask).sum() / mask.sum().clamp_min(1.0)
    return {name: value.detach() for name, value in metrics.items()}
