"""Outcome advantage estimators that compare the n responses sampled for the same prompt (a group).

Shape legend: B = batch (responses), T = response length, G = number of groups. Each estimator takes
`token_level_rewards` (B, T), `response_mask` (B, T) and `index`, an array (B,) of group ids (the `uid` of each
prompt, repeated for its n samples; numpy object array, list or tensor). The outcome score of response i is
s_i = Σ_t r_it. Each returns `(advantages, returns)`, both (B, T), equal here: the per-response advantage
broadcast over its model tokens. All run under no-grad, vectorised over groups; extra keyword arguments are
accepted and ignored so the trainer can call any estimator with one dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hyflow.algorithms.masked import masked_whiten
from hyflow.algorithms.registry import AdvantageEstimator, register_adv_est

__all__ = [
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "group_ids",
]

GroupIndex = np.ndarray | Sequence[Any] | torch.Tensor


def group_ids(index: GroupIndex, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """Map arbitrary hashable group labels (B,) to dense ids 0..G-1 in order of first appearance."""
    labels = index.tolist() if hasattr(index, "tolist") else list(index)
    dense: dict[Any, int] = {}
    ids = [dense.setdefault(label, len(dense)) for label in labels]
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def _group_sum(x: torch.Tensor, ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, ids, x)


def _group_counts(ids: torch.Tensor, num_groups: int, dtype: torch.dtype) -> torch.Tensor:
    """Number of responses in each group (G,), as `dtype` so it divides scores directly."""
    return _group_sum(torch.ones(len(ids), dtype=dtype, device=ids.device), ids, num_groups)


def _outcome_scores_and_groups(
    token_level_rewards: torch.Tensor, index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The prologue of every group estimator: outcome scores s_i = Σ_t r_it (B,), dense group ids (B,), G."""
    scores = token_level_rewards.sum(dim=-1)
    ids, num_groups = group_ids(index, scores.device)
    return scores, ids, num_groups


def _group_stats(scores: torch.Tensor, ids: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, ...]:
    """Per-group (count, mean, unbiased std), each (G,). Groups of one get mean 0 and std 1 (verl's convention)."""
    counts = _group_counts(ids, num_groups, scores.dtype)
    mean = _group_sum(scores, ids, num_groups) / counts
    squares = _group_sum((scores - mean[ids]) ** 2, ids, num_groups)
    std = torch.sqrt(squares / (counts - 1).clamp_min(1.0))
    single = counts < 2
    return counts, mean.masked_fill(single, 0.0), std.masked_fill(single, 1.0)


def _broadcast(scores: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    advantages = scores.unsqueeze(-1) * response_mask.to(scores.dtype)
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GRPO)
@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300): the group-normalised outcome score.

        A_i = (s_i − mean_g) / (std_g + ε)     std_g: unbiased (n−1) std of the group's scores

    A group of one sample uses mean 0 and std 1. With `norm_adv_by_std_in_grpo=False` it is A_i = s_i − mean_g,
    Dr.GRPO (Liu et al. 2025, arXiv:2503.20783), which removes the difficulty bias of the std.
    Keyword arguments used: `index`, `epsilon`, `norm_adv_by_std_in_grpo`.
    """
    with torch.no_grad():
        scores, ids, num_groups = _outcome_scores_and_groups(token_level_rewards, index)
        _, mean, std = _group_stats(scores, ids, num_groups)
        advantages = scores - mean[ids]
        if norm_adv_by_std_in_grpo:
            advantages = advantages / (std[ids] + epsilon)
        return _broadcast(advantages, response_mask)


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training (Chen et al. 2025, arXiv:2503.19595): only the best response of a group learns.

        A_best = (s_max − s_second) / (std_g + ε),   A_other = 0

    (without the std when `norm_adv_by_std_in_grpo=False`). On ties the first best response in the batch is the
    one credited, with advantage 0. Every group needs at least 2 samples (ValueError otherwise).
    Keyword arguments used: `index`, `epsilon`, `norm_adv_by_std_in_grpo`.
    """
    with torch.no_grad():
        scores, ids, num_groups = _outcome_scores_and_groups(token_level_rewards, index)
        counts, _, std = _group_stats(scores, ids, num_groups)
        if bool((counts < 2).any()):  # host sync: controller-side, once per step
            raise ValueError(
                "adv_estimator='grpo_passk' needs at least 2 samples per prompt; set actor_rollout_ref.rollout.n >= 2."
            )
        lowest = torch.full((num_groups,), -torch.inf, dtype=scores.dtype, device=scores.device)
        best = lowest.scatter_reduce(0, ids, scores, reduce="amax")
        positions = torch.arange(len(scores), device=scores.device)
        is_best = scores == best[ids]
        first = torch.full((num_groups,), len(scores), device=scores.device)
        first = first.scatter_reduce(0, ids[is_best], positions[is_best], reduce="amin")
        winner = torch.zeros_like(is_best).index_fill_(0, first, True)
        second = lowest.scatter_reduce(0, ids, scores.masked_fill(winner, -torch.inf), reduce="amax")
        gap = best - second
        if norm_adv_by_std_in_grpo:
            gap = gap / (std + epsilon)
        advantages = torch.where(winner, gap[ids], torch.zeros_like(scores))
        return _broadcast(advantages, response_mask)


@register_adv_est(AdvantageEstimator.RLOO)
@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740): REINFORCE with a leave-one-out baseline.

        A_i = s_i − (1/(n−1)) Σ_{j≠i} s_j       (A_i = s_i for a group of one)

    Keyword arguments used: `index`.
    """
    with torch.no_grad():
        scores, ids, num_groups = _outcome_scores_and_groups(token_level_rewards, index)
        counts = _group_counts(ids, num_groups, scores.dtype)[ids]
        others_sum = _group_sum(scores, ids, num_groups)[ids] - scores
        baseline = torch.where(counts > 1, others_sum / (counts - 1).clamp_min(1.0), torch.zeros_like(scores))
        return _broadcast(scores - baseline, response_mask)


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262): group-mean baseline, then batch whitening.

        A_it = whiten_batch(s_i − mean_g) · m_it     (mean_g = 0 for a group of one)

    The whitening statistics are over all model tokens of the batch, so longer responses weigh more.
    Keyword arguments used: `index`.
    """
    with torch.no_grad():
        scores, ids, num_groups = _outcome_scores_and_groups(token_level_rewards, index)
        _, mean, _ = _group_stats(scores, ids, num_groups)
        advantages, _ = _broadcast(scores - mean[ids], response_mask)
        advantages = masked_whiten(advantages, response_mask) * response_mask.to(advantages.dtype)
        return advantages, advantages


@register_adv_est(AdvantageEstimator.OPO)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv:2505.23585).

        A_i = s_i − b_g,   b_g = Σ_{j∈g} |o_j|·s_j / Σ_{j∈g} |o_j|     (b_g = 0 for a group of one)

    |o_j| is the number of model tokens of response j: the length-weighted mean is the variance-minimising
    baseline under exact on-policy training. Keyword arguments used: `index`.
    """
    with torch.no_grad():
        scores, ids, num_groups = _outcome_scores_and_groups(token_level_rewards, index)
        lengths = response_mask.sum(dim=-1).to(scores.dtype)
        counts = _group_counts(ids, num_groups, scores.dtype)
        weighted = _group_sum(lengths * scores, ids, num_groups) / _group_sum(lengths, ids, num_groups).clamp_min(1e-8)
        baseline = weighted.masked_fill(counts < 2, 0.0)
        return _broadcast(scores - baseline[ids], response_mask)


@register_adv_est(AdvantageEstimator.GPG)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025, "Group Policy Gradient", arXiv:2504.02546): a rescaled group-mean baseline.

        A_i = α · (s_i − mean_g) / F_norm,    α = B / max(1, #{i : s_i ≠ 0})

    α up-weights the batch when few responses carry a reward signal (verl's choice of counting non-zero scores);
    mean_g = 0 for a group of one. Keyword arguments used: `index`, `f_norm`.
    """
    with torch.no_grad():
        scores, ids, num_groups = _outcome_scores_and_groups(token_level_rewards, index)
        _, mean, _ = _group_stats(scores, ids, num_groups)
        alpha = len(scores) / torch.count_nonzero(scores).clamp_min(1).to(scores.dtype)
        return _broadcast(alpha * (scores - mean[ids]) / f_norm, response_mask)


# verl's names for its vectorised GRPO and RLOO: the estimators above are vectorised over groups already.
compute_grpo_vectorized_outcome_advantage = compute_grpo_outcome_advantage
compute_rloo_vectorized_outcome_advantage = compute_rloo_outcome_advantage
