"""Clip-Cov and KL-Cov: policy losses that restrain the few tokens driving entropy collapse.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
(arXiv:2505.22617): the entropy change of the policy is driven by the covariance between a token's log-probability
and its advantage, Cov_it = (A_it − mean(A)) · (log π_it − mean(log π)) (means over the valid tokens of the
micro-batch). A small fraction of tokens with a large covariance is either detached from the gradient (Clip-Cov)
or given a KL penalty (KL-Cov). Shapes and the loss signature are those of `policy_losses.py`.

Both select tokens by value, which needs the number of valid tokens on the host: one deliberate sync per call.
The selection is over the micro-batch the loss sees, as in the paper's implementation.
"""

from __future__ import annotations

from typing import Any

import torch

from hyflow.algorithms.masked import masked_mean
from hyflow.algorithms.policy_losses import (
    aggregate_token_losses,
    clamp_log_ratio,
    clip_bounds,
    config_value,
    policy_loss_metrics,
    surrogate_terms,
)
from hyflow.algorithms.registry import register_policy_loss

__all__ = ["compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov", "token_covariance"]


def token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(A − mean A) · (log π − mean log π) per token (B, T), means over the masked tokens, log π detached."""
    log_prob = log_prob.detach()
    return (advantages - masked_mean(advantages, response_mask)) * (log_prob - masked_mean(log_prob, response_mask))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov: PPO's clipped surrogate, with the gradient of a few high-covariance tokens removed.

    Among valid tokens not already clipped by PPO whose covariance lies in (clip_cov_lb, clip_cov_ub),
    k = max(1, ⌊clip_cov_ratio · N_valid⌋) are drawn at random and their loss set to 0:

        L_it = max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)) · (0 if token it is drawn else 1)

    Config: `policy_loss.clip_cov_ratio`, `policy_loss.clip_cov_lb`, `policy_loss.clip_cov_ub`, clip bounds.
    Metrics: `pg_clipfrac` (fraction of valid tokens detached), `ppo_kl`, `pg_clipfrac_lower` (0).
    """
    eps_low, eps_high = clip_bounds(config)
    ratio_fraction = config_value(config, "policy_loss.clip_cov_ratio")
    lower, upper = config_value(config, "policy_loss.clip_cov_lb"), config_value(config, "policy_loss.clip_cov_ub")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(clamp_log_ratio(log_ratio))
    unclipped, clipped = surrogate_terms(ratio, advantages, eps_low, eps_high)
    valid = response_mask > 0
    covariance = token_covariance(advantages, log_prob, response_mask)
    candidates = valid & ~(clipped > unclipped) & (covariance > lower) & (covariance < upper)
    candidate_idx = candidates.flatten().nonzero().squeeze(-1)  # host sync (see module docstring)
    num_detach = max(int(ratio_fraction * int(valid.sum())), 1)
    chosen = candidate_idx[torch.randperm(len(candidate_idx), device=candidate_idx.device)[:num_detach]]
    keep = torch.ones(valid.numel(), dtype=ratio.dtype, device=ratio.device).index_fill_(0, chosen, 0.0)
    keep = keep.view_as(ratio)
    pg_losses = torch.maximum(unclipped, clipped) * keep
    metrics = policy_loss_metrics(response_mask, -log_ratio, clipped=keep == 0)
    return aggregate_token_losses(pg_losses, response_mask, loss_agg_mode, kwargs), metrics


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov: the unclipped surrogate, plus a KL penalty on the top-k covariance tokens.

    With k = max(1, ⌊kl_cov_ratio · N_valid⌋) valid tokens of largest covariance:

        L_it = −A·ρ + β·|log ρ|   for the top-k tokens,    L_it = −A·ρ   otherwise     (β = ppo_kl_coef)

    Config: `policy_loss.kl_cov_ratio`, `policy_loss.ppo_kl_coef`. Metrics: `ppo_kl` (mean |log ρ|, as in verl),
    clip fractions 0.
    """
    ratio_fraction = config_value(config, "policy_loss.kl_cov_ratio")
    kl_coef = config_value(config, "policy_loss.ppo_kl_coef")
    log_ratio = log_prob - old_log_prob
    pg_losses = -advantages * torch.exp(clamp_log_ratio(log_ratio))
    valid = response_mask > 0
    valid_idx = valid.flatten().nonzero().squeeze(-1)  # host sync (see module docstring)
    if len(valid_idx) > 0 and ratio_fraction > 0:
        # covariance over the valid tokens only (plain means over them)
        valid_advantages = advantages.flatten()[valid_idx]
        valid_log_prob = log_prob.detach().flatten()[valid_idx]
        covariance = (valid_advantages - valid_advantages.mean()) * (valid_log_prob - valid_log_prob.mean())
        num_penalised = max(1, int(len(valid_idx) * ratio_fraction))
        top = valid_idx[torch.topk(covariance, num_penalised).indices]
        penalised = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device).index_fill_(0, top, True)
        pg_losses = torch.where(penalised.view_as(valid), pg_losses + kl_coef * log_ratio.abs(), pg_losses)
    metrics = policy_loss_metrics(response_mask, log_ratio.abs())
    return aggregate_token_losses(pg_losses, response_mask, loss_agg_mode, kwargs), metrics
