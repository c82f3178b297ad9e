"""`algorithm.*`: the advantage estimator, KL in the reward, and group filtering (DAPO's dynamic sampling).

`adv_estimator` is a name in hyflow's estimator registry (`hyflow.algorithms.get_adv_estimator_fn`): the
built-ins are `gae`, `grpo`, `rloo`, `reinforce_plus_plus`, `reinforce_plus_plus_baseline`, `remax`, `opo`, `gpg`,
`grpo_passk`, and user code can register more with `@register_adv_est(name)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

KLPenaltyType = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]

# Estimators that compare the n samples of one prompt with each other, so they need rollout.n > 1.
GROUP_ADV_ESTIMATORS = frozenset(
    {"grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "grpo_passk", "reinforce_plus_plus_baseline", "opo", "gpg"}
)


@dataclass
class KLControlConfig:
    """Coefficient of the KL penalty in the reward: fixed, or adaptive (Ziegler et al. 2019) toward `target_kl`."""

    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: drop groups whose `metric` is the same for all n samples, regenerate to refill."""

    enable: bool = False
    metric: str | None = None  # e.g. "acc", "score", "seq_reward", "seq_final_reward"
    max_num_gen_batches: int = 0  # 0: no limit


@dataclass
class PFPPOConfig:
    """PF-PPO's resampling of the batch by reward (`hyflow.algorithms.pf_ppo`)."""

    reweight_method: Literal["pow", "max_min", "max_random"] = "pow"  # how a response's score becomes its weight
    weight_pow: float = 2.0  # the exponent of |score| for reweight_method=pow


@dataclass
class AlgorithmConfig:
    """How rewards become advantages."""

    adv_estimator: str = "gae"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True  # False: Dr. GRPO
    use_kl_in_reward: bool = False
    kl_penalty: KLPenaltyType = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    use_pf_ppo: bool = False  # resample each batch by reward after the advantages (with adv_estimator=gae, as verl)
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
