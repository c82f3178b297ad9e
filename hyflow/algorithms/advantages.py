"""Token-level advantage estimators that walk the response through time: GAE, REINFORCE++ and ReMax.

Shape legend: B = batch (responses), T = response length. Every estimator takes `token_level_rewards` (B, T) and
`response_mask` (B, T; 1 = model token, 0 = padding or a tool/observation/user token) and returns
`(advantages, returns)`, both (B, T), computed under no-grad. Extra keyword arguments are accepted and ignored,
so the trainer can call any estimator with one dict of everything it has.

Masked positions inside a response (tool output between two model turns) are not time steps: the recursions
skip them, so they carry the next model token's value and advantage through, and the result on the model tokens
equals that of the same response with the hole cut out. A reward that sits on a masked position (for example the
score placed on the last token of a trailing tool observation) is credited to the model token just before it.
The group estimators (GRPO, RLOO, ...) live in `group_advantages.py`.
"""

from __future__ import annotations

from typing import Any

import torch

from hyflow.algorithms.masked import masked_whiten
from hyflow.algorithms.registry import AdvantageEstimator, register_adv_est

__all__ = [
    "compute_gae_advantage_return",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "fold_masked_rewards",
]


def fold_masked_rewards(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Move each reward on a masked position onto the closest model token before it (undiscounted).

    Rewards on masked positions before the first model token have no action to credit and are dropped.
    """
    valid = response_mask > 0
    positions = torch.arange(token_level_rewards.shape[-1], device=token_level_rewards.device)
    positions = positions.expand_as(token_level_rewards)
    # index of the last model token at or before each position (-1 when there is none yet)
    last_valid = torch.where(valid, positions, torch.full_like(positions, -1)).cummax(dim=-1).values
    keep = last_valid >= 0
    folded = torch.zeros_like(token_level_rewards)
    folded.scatter_add_(-1, last_valid.clamp_min(0), torch.where(keep, token_level_rewards, 0.0))
    return folded


def _setting(value: float | None, config: Any, name: str) -> float:
    """`value` when given, else `config.<name>` (the algorithm config); ValueError when neither is there."""
    if value is not None:
        return value
    if config is not None and getattr(config, name, None) is not None:
        return getattr(config, name)
    raise ValueError(f"The advantage estimator needs `{name}`: pass it, or pass config= with algorithm.{name} set.")


@register_adv_est(AdvantageEstimator.GAE)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | None = None,
    lam: float | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438), as used by PPO.

    Backwards over the model tokens t (masked positions skipped), with V(s_{T}) = 0:

        δ_t = r_t + γ·V_{t+1} − V_t,    A_t = δ_t + γ·λ·A_{t+1},    R_t = A_t + V_t

    where t+1 is the next *model* token. Advantages are then whitened over all model tokens of the batch
    (`masked_whiten`); returns (the critic's targets) are not. Masked positions hold the carried values.

    Keyword arguments used: `values` (B, T, the critic's V), `gamma`, `lam` (each read from `config.gamma` /
    `config.lam` when not given).
    """
    if values is None:
        raise ValueError("adv_estimator='gae' needs the critic's `values`; enable a critic (critic.model.path).")
    gamma = _setting(gamma, config, "gamma")
    lam = _setting(lam, config, "lam")
    with torch.no_grad():
        rewards = fold_masked_rewards(token_level_rewards, response_mask)
        valid = response_mask > 0
        next_value = torch.zeros_like(values[:, 0])
        next_advantage = torch.zeros_like(values[:, 0])
        advantages = torch.zeros_like(values)
        for t in reversed(range(values.shape[-1])):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            advantage = delta + gamma * lam * next_advantage
            next_value = torch.where(valid[:, t], values[:, t], next_value)
            next_advantage = torch.where(valid[:, t], advantage, next_advantage)
            advantages[:, t] = next_advantage
        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask) * valid
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): the discounted return-to-go, whitened over the batch.

        G_t = r_t + γ·G_{t+1}   (over model tokens, masked positions skipped),    A = whiten(G) · mask

    `returns` is G on model tokens and 0 elsewhere. Keyword arguments used: `gamma` (read from `config.gamma`
    when not given).
    """
    gamma = _setting(gamma, config, "gamma")
    with torch.no_grad():
        rewards = fold_masked_rewards(token_level_rewards, response_mask)
        valid = response_mask > 0
        running = torch.zeros_like(rewards[:, 0])
        returns = torch.zeros_like(rewards)
        for t in reversed(range(rewards.shape[-1])):
            running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
            returns[:, t] = running * valid[:, t]  # masked positions (tool output, padding) carry no return
        advantages = masked_whiten(returns, response_mask) * valid
    return advantages, returns


@register_adv_est(AdvantageEstimator.REMAX)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2024, arXiv:2310.10505): REINFORCE with the greedy response's reward as baseline.

        G_t = Σ_{t' ≥ t} r_{t'}  (on model tokens),    A_t = G_t − b,   b = reward of the greedy response

    Keyword arguments used: `reward_baselines` (B,), the score of each prompt's greedy decode.
    """
    if reward_baselines is None:
        raise ValueError("adv_estimator='remax' needs `reward_baselines` (the reward of a greedy response per prompt).")
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = token_level_rewards.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask
        advantages = returns - reward_baselines.unsqueeze(-1).to(returns.dtype) * mask
    return advantages, returns
