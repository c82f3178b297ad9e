"""The single controller's light math on a `DataProto`: response mask, KL penalty in the reward, advantages.

These run on the controller between worker calls, on the whole batch (no model weights involved):

    data.batch[F.RESPONSE_MASK] = compute_response_mask(data)
    data, kl_metrics = apply_kl_penalty(data, kl_ctrl, kl_penalty="low_var_kl")   # when use_kl_in_reward
    data = compute_advantage(data, adv_estimator="grpo", norm_adv_by_std_in_grpo=True)

Shape legend: B = rows (responses), P = prompt length, R = response length, T = P + R.
"""

from __future__ import annotations

import inspect
import logging
from enum import Enum
from typing import Any

import torch

from hyflow import fields as F
from hyflow.algorithms import apply_kl_penalty_to_rewards, get_adv_estimator_fn
from hyflow.algorithms.kl import AdaptiveKLController, FixedKLController
from hyflow.algorithms.pf_ppo import pf_ppo_sample_indices
from hyflow.protocol import DataProto

__all__ = ["apply_kl_penalty", "compute_advantage", "compute_response_mask", "step_advantages"]

logger = logging.getLogger(__name__)


def _has(data: DataProto, key: str) -> bool:
    """Whether `data.batch` holds `key` (through keys(): older tensordict versions reject `key in td`)."""
    return data.batch is not None and key in data.batch.keys()  # noqa: SIM118


def _require(data: DataProto, key: str, why: str) -> torch.Tensor:
    """`data.batch[key]`, or a ValueError saying which stage should have produced it."""
    if not _has(data, key):
        present = sorted(data.batch.keys()) if data.batch is not None else []
        raise ValueError(f"{why} needs batch['{F.describe(key)}'], which is missing (present: {present}).")
    return data.batch[key]


def compute_response_mask(data: DataProto) -> torch.Tensor:
    """The response part of the attention mask, (B, R): 1 on response tokens, 0 on right padding.

    R is the width of `responses`; the full `attention_mask` is (B, P + R), prompt first. Agent loops that mask
    tool and user tokens write their own `response_mask`, which the trainer keeps.
    """
    responses = _require(data, F.RESPONSES, "compute_response_mask")
    attention_mask = _require(data, F.ATTENTION_MASK, "compute_response_mask")
    return attention_mask[:, -responses.shape[-1] :].clone()  # own storage: agent loops edit it in place


def apply_kl_penalty(
    data: DataProto,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kl_penalty: str = "kl",
) -> tuple[DataProto, dict[str, torch.Tensor | float]]:
    """KL in the reward (Ouyang et al. 2022, InstructGPT; Ziegler et al. 2019), then one controller update.

        token_level_rewards_t = token_level_scores_t − β · KL_t(old ‖ ref)     on response tokens
        KL_t = kl_penalty(old_log_probs_t, ref_log_prob_t)                        (k1, k2, k3, abs, ...)

    β is `kl_ctrl.value`; the controller is then updated with the batch's mean per-sequence KL over B rows
    (a no-op for the fixed controller; the adaptive one reads it on the host, once per step).
    Returns the data with `token_level_rewards` set, and metrics `actor/reward_kl_penalty` (mean KL, a tensor)
    and `actor/reward_kl_penalty_coeff` (the β that was used).
    """
    scores = _require(data, F.TOKEN_LEVEL_SCORES, "algorithm.use_kl_in_reward")
    old_log_probs = _require(data, F.OLD_LOG_PROBS, "algorithm.use_kl_in_reward")
    ref_log_prob = _require(data, F.REF_LOG_PROB, "algorithm.use_kl_in_reward (the reference policy)")
    if not _has(data, F.RESPONSE_MASK):
        data.batch[F.RESPONSE_MASK] = compute_response_mask(data)
    beta = kl_ctrl.value
    rewards, current_kl = apply_kl_penalty_to_rewards(
        token_level_scores=scores,
        old_log_probs=old_log_probs,
        ref_log_prob=ref_log_prob,
        response_mask=data.batch[F.RESPONSE_MASK],
        kl_coef=beta,
        kl_penalty_type=kl_penalty,
    )
    data.batch[F.TOKEN_LEVEL_REWARDS] = rewards
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return data, metrics


def _estimator_kwargs(fn: Any, available: dict[str, Any]) -> dict[str, Any]:
    """All of `available` for estimators taking **kwargs; otherwise only the parameters `fn` names."""
    parameters = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return available
    return {name: value for name, value in available.items() if name in parameters}


def compute_advantage(
    data: DataProto,
    adv_estimator: str | Enum,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> DataProto:
    """Fill `advantages` and `returns` (B, R) with the estimator registered under `adv_estimator`.

    The estimator is called with every field it may need: `token_level_rewards`, `response_mask`, `index` (the
    `uid` of each row, so the n samples of one prompt form a group), `values` (critic, for GAE),
    `reward_baselines` (greedy reward, for ReMax), `gamma`, `lam`, `norm_adv_by_std_in_grpo`, `num_repeat`
    (= rollout.n) and `config` (the algorithm config). Estimators with `**kwargs` get them all; a user estimator
    without it gets only the parameters it names. A missing `response_mask` is derived from the attention mask.
    """
    fn = get_adv_estimator_fn(adv_estimator)
    rewards = _require(data, F.TOKEN_LEVEL_REWARDS, f"algorithm.adv_estimator={adv_estimator!s}")
    if not _has(data, F.RESPONSE_MASK):
        data.batch[F.RESPONSE_MASK] = compute_response_mask(data)
    available: dict[str, Any] = {
        "token_level_rewards": rewards,
        "response_mask": data.batch[F.RESPONSE_MASK],
        "index": data.non_tensor_batch.get(F.UID),
        "values": data.batch[F.VALUES] if _has(data, F.VALUES) else None,
        "reward_baselines": data.batch[F.REWARD_BASELINES] if _has(data, F.REWARD_BASELINES) else None,
        "gamma": gamma,
        "lam": lam,
        "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo,
        "num_repeat": num_repeat,
        "config": config,
    }
    index_param = inspect.signature(fn).parameters.get("index")
    if available["index"] is None and index_param is not None and index_param.default is inspect.Parameter.empty:
        raise ValueError(
            f"algorithm.adv_estimator={adv_estimator!s} groups the samples of each prompt, so it needs "
            f"non_tensor_batch['{F.describe(F.UID)}']. Give every prompt a uid before repeating it rollout.n times."
        )
    advantages, returns = fn(**_estimator_kwargs(fn, available))
    data.batch[F.ADVANTAGES] = advantages
    data.batch[F.RETURNS] = returns
    return data


def pf_ppo_resample(data: DataProto, reweight_method: str, weight_pow: float) -> DataProto:
    """PF-PPO: the batch resampled by reward (`hyflow.algorithms.pf_ppo`), rows drawn with replacement."""
    scores = _require(data, F.TOKEN_LEVEL_SCORES, "algorithm.use_pf_ppo=True").sum(dim=-1)
    return data[pf_ppo_sample_indices(scores, reweight_method, weight_pow)]


def step_advantages(
    batch: DataProto, algorithm: Any, kl_ctrl: Any, rollout_n: int, metrics: dict[str, Any]
) -> DataProto:
    """The trainer's advantage stage: token_level_rewards (scores, minus the KL penalty when
    `algorithm.use_kl_in_reward`, its metrics added to `metrics`), then the advantages of `algorithm.adv_estimator`,
    then PF-PPO's resampling when enabled (with GAE only, as verl)."""
    if algorithm.use_kl_in_reward:
        batch, kl_metrics = apply_kl_penalty(batch, kl_ctrl, kl_penalty=algorithm.kl_penalty)
        metrics.update({name: float(value) for name, value in kl_metrics.items()})
    else:
        batch.batch[F.TOKEN_LEVEL_REWARDS] = batch.batch[F.TOKEN_LEVEL_SCORES]
    batch = compute_advantage(
        batch,
        adv_estimator=algorithm.adv_estimator,
        gamma=algorithm.gamma,
        lam=algorithm.lam,
        num_repeat=rollout_n,
        norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo,
        config=algorithm,
    )
    if algorithm.use_pf_ppo and algorithm.adv_estimator == "gae":
        batch = pf_ppo_resample(batch, algorithm.pf_ppo.reweight_method, algorithm.pf_ppo.weight_pow)
    return batch
