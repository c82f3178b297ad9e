"""Policy-gradient losses: PPO's clipped surrogate and its relatives, each registered by name.

Shape legend: B = batch, T = response length; `old_log_prob`, `log_prob`, `advantages`, `response_mask` are all
(B, T). Every loss has the signature

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **kwargs) -> (loss, metrics)

`config` is any object with the actor's attributes (`clip_ratio`, `clip_ratio_low`, `clip_ratio_high`,
`clip_ratio_c`, and a `policy_loss` sub-object with the loss-specific knobs); `None` clip bounds fall back to
`clip_ratio`. Keyword arguments: `batch_num_tokens`, `global_batch_size`, `loss_scale_factor`, `dp_size` are
forwarded to `agg_loss`; `rollout_is_weights` (B, T), when given, multiplies the per-token loss (a correction for
the rollout engine's sampling distribution); anything else (`rollout_log_probs`, `token_level_rewards`, ...) is
available to custom losses and ignored here. Metrics are detached tensors (no host sync), with verl's names.
"""

from __future__ import annotations

from typing import Any

import torch

from hyflow.algorithms.aggregation import agg_loss
from hyflow.algorithms.masked import masked_mean
from hyflow.algorithms.registry import register_policy_loss
from hyflow.algorithms.rollout_correction import (
    correction_metrics,
    parse_rejection_rules,
    rejection_mask,
    rollout_is_weights,
    threshold_hits,
)

__all__ = [
    "aggregate_token_losses",
    "clamp_log_ratio",
    "clip_bounds",
    "compute_policy_loss_cispo",
    "compute_policy_loss_dro",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_reinforce_is",
    "compute_policy_loss_vanilla",
    "config_value",
    "policy_loss_metrics",
    "surrogate_terms",
]

_AGG_KWARGS = ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor")


def aggregate_token_losses(
    loss_mat: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str, kwargs: dict[str, Any]
) -> torch.Tensor:
    """Apply the optional rollout importance weights, then `agg_loss` with the forwarded global counts."""
    weights = kwargs.get("rollout_is_weights")
    if weights is not None:
        loss_mat = loss_mat * weights
    return agg_loss(loss_mat, response_mask, loss_agg_mode, **{k: kwargs[k] for k in _AGG_KWARGS if k in kwargs})


def config_value(config: Any, path: str) -> Any:
    """Read a dotted attribute path from the actor config, with an error naming the missing key."""
    value = config
    for part in path.split("."):
        if value is None or not hasattr(value, part):
            raise ValueError(
                f"The policy loss needs actor_rollout_ref.actor.{path}, which the given config does not have. "
                "Pass the actor config (ActorConfig) or an object with that attribute."
            )
        value = getattr(value, part)
    return value


def clip_bounds(config: Any) -> tuple[float, float]:
    """(ε_low, ε_high): `clip_ratio_low` / `clip_ratio_high`, each falling back to `clip_ratio` when None."""
    clip_ratio = config_value(config, "clip_ratio")
    low = getattr(config, "clip_ratio_low", None)
    high = getattr(config, "clip_ratio_high", None)
    return (clip_ratio if low is None else low), (clip_ratio if high is None else high)


def clamp_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """log(π/π_old) clamped to ±20, so exp() cannot overflow."""
    return torch.clamp(log_ratio, min=-20.0, max=20.0)


def surrogate_terms(
    ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's two surrogate terms per token, before their max: (−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high))."""
    return -advantages * ratio, -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)


def policy_loss_metrics(
    response_mask: torch.Tensor,
    ppo_kl: torch.Tensor,
    clipped: torch.Tensor | None = None,
    clipped_lower: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """verl's policy-loss metrics as detached masked means over the response tokens (no host sync).

    `ppo_kl` is the per-token KL estimate; `clipped` / `clipped_lower` mark the tokens a clip acted on (bool,
    (B, T)). A loss without that clip passes None and reports 0.
    """
    kl = masked_mean(ppo_kl, response_mask).detach()

    def fraction(tokens: torch.Tensor | None) -> torch.Tensor:
        return torch.zeros_like(kl) if tokens is None else masked_mean(tokens.float(), response_mask).detach()

    return {"pg_clipfrac": fraction(clipped), "ppo_kl": kl, "pg_clipfrac_lower": fraction(clipped_lower)}


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with clip-higher and dual-clip.

        ρ = exp(log π − log π_old)
        L_clip = max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high))
        L = min(L_clip, −A·c)  if A < 0   (dual-clip, Ye et al. 2020, arXiv:1912.09729; c = clip_ratio_c > 1)
        L = L_clip             otherwise

    ε_high > ε_low is DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476). Metrics: `pg_clipfrac` (tokens where
    the ratio clip is active), `pg_clipfrac_lower` (negative-advantage tokens bounded by the dual clip), `ppo_kl`
    (mean of log π_old − log π).
    """
    eps_low, eps_high = clip_bounds(config)
    clip_ratio_c = config_value(config, "clip_ratio_c")
    if not clip_ratio_c > 1.0:
        raise ValueError(
            f"actor_rollout_ref.actor.clip_ratio_c={clip_ratio_c}: the dual-clip bound must be greater than 1.0 "
            "(verl's default is 3.0)."
        )
    log_ratio = clamp_log_ratio(log_prob - old_log_prob)
    unclipped, clipped = surrogate_terms(torch.exp(log_ratio), advantages, eps_low, eps_high)
    clip_loss = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(clip_loss, dual_bound), clip_loss)
    metrics = policy_loss_metrics(
        response_mask, -log_ratio, clipped=clipped > unclipped, clipped_lower=(clip_loss > dual_bound) & negative
    )
    return aggregate_token_losses(pg_losses, response_mask, loss_agg_mode, kwargs), metrics


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071).

    The importance ratio is the length-normalised *sequence* likelihood ratio, clipped like PPO:

        s_i = exp( (1/|y_i|) Σ_t (log π_it − log π_old,it) )
        s_it = sg[s_i] · π_it / sg[π_it]      (value s_i, gradient s_i·∇log π_it)
        L_it = max(−A_it·s_it, −A_it·clip(s_it, 1 − ε_low, 1 + ε_high))

    The paper aggregates with `seq-mean-token-mean` (set `loss_agg_mode` to it). Metrics as for `vanilla`
    (`pg_clipfrac_lower` is 0: there is no dual clip).
    """
    eps_low, eps_high = clip_bounds(config)
    token_log_ratio = log_prob - old_log_prob
    seq_log_ratio = masked_mean(token_log_ratio, response_mask, axis=-1)
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_seq_ratio, max=10.0))
    unclipped, clipped = surrogate_terms(seq_ratio, advantages, eps_low, eps_high)
    pg_losses = torch.maximum(unclipped, clipped)
    metrics = policy_loss_metrics(response_mask, -token_log_ratio, clipped=clipped > unclipped)
    return aggregate_token_losses(pg_losses, response_mask, loss_agg_mode, kwargs), metrics


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GPG (Chu et al. 2025, arXiv:2504.02546): plain policy gradient, no ratio and no clipping.

        L_it = −A_it · log π_it

    Pair it with `adv_estimator=gpg`. Metrics are reported for a uniform log: `ppo_kl` as for `vanilla`,
    clip fractions 0.
    """
    pg_losses = -advantages * log_prob
    metrics = policy_loss_metrics(response_mask, old_log_prob - log_prob)
    return aggregate_token_losses(pg_losses, response_mask, loss_agg_mode, kwargs), metrics


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax 2025, MiniMax-M1, arXiv:2506.13585): clip the importance weight, not the update.

        r̂_it = clip(ρ_it, 1 − ε_low, 1 + ε_high),    L_it = −sg[r̂_it] · A_it · log π_it

    Every token keeps its gradient (PPO zeroes clipped ones). The bounds are the actor's clip bounds (as in
    `vanilla`). Metrics: `pg_clipfrac` (tokens whose weight was clipped), `ppo_kl`; `pg_clipfrac_lower` counts
    the tokens clipped from below.
    """
    eps_low, eps_high = clip_bounds(config)
    log_ratio = clamp_log_ratio(log_prob - old_log_prob)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1 - eps_low, 1 + eps_high).detach()
    pg_losses = -weight * advantages * log_prob
    metrics = policy_loss_metrics(response_mask, -log_ratio, clipped=ratio != weight, clipped_lower=ratio < 1 - eps_low)
    return aggregate_token_losses(pg_losses, response_mask, loss_agg_mode, kwargs), metrics


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DRO, Direct Reward Optimisation (Richemond et al. 2024, arXiv:2405.19107): a policy gradient with a
    quadratic penalty on the log-ratio instead of a clip.

        L_it = −(A_it · log π_it − ½ β · (log π_it − log π_old,it)²),    β = `policy_loss.dro_beta` > 0

    Metrics: `ppo_kl`; clip fractions 0 (nothing is clipped).

    Raises:
        ValueError: `dro_beta` is unset or not positive.
    """
    beta = config_value(config, "policy_loss.dro_beta")
    if beta is None or beta <= 0:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.dro_beta={beta!r}: loss_mode=dro needs a positive β "
            "(the weight of the squared log-ratio penalty), e.g. dro_beta=0.05."
        )
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    metrics = policy_loss_metrics(response_mask, -log_ratio)
    return aggregate_token_losses(pg_losses, response_mask, loss_agg_mode, kwargs), metrics


@register_policy_loss("reinforce_is")
def compute_policy_loss_reinforce_is(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE with truncated importance weights against the behaviour policy π_old (bypass mode of
    `algorithm.rollout_correction`, `loss_type=reinforce`, where π_old = π_rollout, the engine's log-probs):

        w_t = min(π_θ(t) / π_old(t), C)                         (rollout_is=token)
        w_t = min(Π_s π_θ(s) / π_old(s), C)                     (rollout_is=sequence; null: w = 1)
        L_t = −sg[w_t] · k_t · A_t · log π_θ(t)

    so ∇L = −w·A·∇log π_θ, the policy gradient for tokens sampled by π_old with truncated IS (no PPO clip). k_t is
    the `rollout_rs` rejection mask of π_θ against π_old (a rejected token adds 0; the normalisation of
    `loss_agg_mode` still counts it). Weights and mask come from `hyflow.algorithms.rollout_correction`, with
    `rollout_is_batch_normalize` over this micro-batch. The settings are the `rollout_correction` keyword (a
    `RolloutCorrectionConfig`; the trainer sends it with the batch). Metrics: `ppo_kl`, `pg_clipfrac` (tokens whose
    weight the threshold truncated, or zeroed with IcePop bounds), and the mean-type `rollout_corr/*` metrics of π_θ
    against π_old.
    """
    settings = kwargs.get("rollout_correction")
    if settings is None:
        raise ValueError(
            "the reinforce_is policy loss needs the rollout_correction keyword (algorithm.rollout_correction: "
            "rollout_is, rollout_is_threshold, rollout_rs, ...). The trainer sends it when "
            "algorithm.rollout_correction.bypass_mode=True and loss_type=reinforce; a direct call passes "
            "rollout_correction=RolloutCorrectionConfig(...)."
        )
    current = log_prob.detach()
    weights, threshold = None, None
    if settings.rollout_is is not None:
        threshold = settings.rollout_is_threshold
        weights = rollout_is_weights(
            current, old_log_prob, response_mask, settings.rollout_is, threshold, settings.rollout_is_batch_normalize
        )
    kept = None
    if settings.rollout_rs is not None:
        rules = parse_rejection_rules(settings.rollout_rs, settings.rollout_rs_threshold)
        kept = rejection_mask(current, old_log_prob, response_mask, rules)
    scale = torch.ones_like(current) if weights is None else weights
    if kept is not None:
        scale = scale * kept
    pg_losses = -scale * advantages * log_prob
    log_ratio = clamp_log_ratio(current - old_log_prob)
    truncated = None if threshold is None else threshold_hits(log_ratio, threshold)
    metrics = policy_loss_metrics(response_mask, -log_ratio, clipped=truncated)
    correction = correction_metrics(current, old_log_prob, response_mask, weights, kept, threshold)
    correction.pop("rollout_corr/is_weight_max", None)  # the actor averages loss metrics over micro-batches
    metrics.update(correction)
    return aggregate_token_losses(pg_losses, response_mask, loss_agg_mode, kwargs), metrics
