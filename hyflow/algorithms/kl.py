"""KL divergence between the policy and the reference model: per-token estimators and the KL coefficient.

Shapes: `logprob` and `ref_logprob` are (B, T), the log-probability of each sampled token under the policy and
under the reference (these two parameter names are verl's, kept so ported code that passes them by keyword runs;
everywhere else hyflow spells it `log_prob`). The estimators follow Schulman, "Approximating KL Divergence" (2020,
http://joschu.net/blog/kl-approx.html). The KL is used either as a loss term (`actor.use_kl_loss`,
`actor.kl_loss_type`) or inside the reward (`algorithm.use_kl_in_reward`, `algorithm.kl_penalty`,
`algorithm.kl_ctrl`).
"""

from __future__ import annotations

from typing import Any

import torch

from hyflow.algorithms.masked import masked_mean

__all__ = [
    "KL_PENALTY_TYPES",
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty_to_rewards",
    "get_kl_controller",
    "kl_penalty",
]

KL_PENALTY_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def _kl_estimate(log_ratio: torch.Tensor, kind: str) -> torch.Tensor:
    """The per-token estimate of KL(π‖π_ref) from log_ratio = log π − log π_ref (tokens sampled from π)."""
    if kind in ("kl", "k1"):
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind in ("mse", "k2"):
        return 0.5 * log_ratio.square()
    if kind in ("low_var_kl", "k3"):
        ref_over_policy = torch.clamp(-log_ratio, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(ref_over_policy) - ref_over_policy - 1, min=-10.0, max=10.0)
    allowed = list(KL_PENALTY_TYPES) + [f"{k}+" for k in KL_PENALTY_TYPES]
    raise ValueError(
        f"kl_penalty={kind!r} is not a known KL estimator (actor.kl_loss_type / algorithm.kl_penalty). "
        f"Allowed values: {allowed}."
    )


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL penalty (B, T), with x = log π − log π_ref:

    - ``kl`` / ``k1``: x                       (unbiased, high variance)
    - ``abs``:        |x|
    - ``mse`` / ``k2``: x² / 2                  (biased, low variance; its gradient is the true KL gradient)
    - ``low_var_kl`` / ``k3``: e^{−x} + x − 1   (unbiased, non-negative; clamped to [−10, 10] for stability)

    A trailing ``+`` (e.g. ``k3+``) gives the value of the named estimator with the gradient of ``k2``
    (straight-through), which is unbiased for the KL's gradient.
    """
    log_ratio = logprob - ref_logprob
    if kl_penalty.endswith("+"):
        value = _kl_estimate(log_ratio, kl_penalty[:-1])
        gradient_carrier = 0.5 * log_ratio.square()
        return value.detach() + gradient_carrier - gradient_carrier.detach()
    return _kl_estimate(log_ratio, kl_penalty)


class FixedKLController:
    """A constant KL coefficient (`algorithm.kl_ctrl.type=fixed`)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient stays fixed."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning LMs from Human Preferences", arXiv:1909.08593).

    e = clip(KL / KL_target − 1, −0.2, 0.2),    β ← β · (1 + e · n_steps / horizon)
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if not horizon > 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon={horizon}: the adaptive controller needs horizon > 0.")
        if not target_kl > 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl={target_kl}: the adaptive controller needs target_kl > 0.")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient towards the target KL after `n_steps` samples (or steps) at `current_kl`."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """Build the controller from `algorithm.kl_ctrl` (attributes `type`, `kl_coef`, `target_kl`, `horizon`)."""
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_coef=kl_ctrl.kl_coef)
    if kl_ctrl.type == "adaptive":
        return AdaptiveKLController(init_kl_coef=kl_ctrl.kl_coef, target_kl=kl_ctrl.target_kl, horizon=kl_ctrl.horizon)
    raise ValueError(
        f"algorithm.kl_ctrl.type={kl_ctrl.type!r} is not supported. Allowed values: ['fixed', 'adaptive']."
    )


def apply_kl_penalty_to_rewards(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kl_penalty_type: str = "kl",
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL in the reward (Ouyang et al. 2022, InstructGPT): r_t = score_t − β · KL_t on model tokens.

    Returns `(token_level_rewards, current_kl)`, where `current_kl` is the batch mean of each sequence's mean
    per-token KL, the quantity the adaptive controller tracks.
    """
    kl = kl_penalty(old_log_probs, ref_log_prob, kl_penalty_type) * response_mask
    rewards = token_level_scores - kl_coef * kl
    current_kl = masked_mean(kl, response_mask, axis=-1).mean()
    return rewards, current_kl
