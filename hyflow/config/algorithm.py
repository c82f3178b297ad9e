"""`algorithm.*`: the advantage estimator, KL in the reward, group filtering (DAPO's dynamic sampling) and the
off-policy corrections for tokens the engine sampled (`rollout_correction`, checked in `config/rollout_correction.py`).

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
class RolloutCorrectionConfig:
    """Corrections for the gap between the engine that sampled the tokens (π_rollout) and the trainer's policy, with
    verl's keys; the math is `hyflow.algorithms.rollout_correction`, the how-to docs/howto/off_policy.md.

    Decoupled mode (`bypass_mode=False`): the old-log-prob pass runs and the loss gets IS weights π_old/π_rollout
    and a rejection mask. Bypass mode: no old-log-prob pass, π_old := π_rollout, and `loss_type` picks PPO's
    clipped ratio against π_rollout or REINFORCE with truncated IS weights π_θ/π_rollout. All of it needs the
    engine's log-probs (`actor_rollout_ref.rollout.calculate_log_probs=True`).
    """

    rollout_is: Literal["token", "sequence"] | None = None  # truncated IS weights per token or per response; null: off
    # upper bound C of the IS weight (> 0, truncated IS), or "lower_upper" (e.g. "0.5_5.0"): a weight whose ratio
    # lies outside [lower, upper] is 0, the token masked out of the loss (IcePop)
    rollout_is_threshold: float | str = 2.0
    rollout_is_batch_normalize: bool = False  # rescale the truncated weights to mean 1 over the batch
    # Rejection (masked IS): comma-separated options among token_k1..k3, seq_sum_k1..k3, seq_mean_k1..k3,
    # seq_max_k2/k3; null: off.
    rollout_rs: str | None = None
    # One bound per rollout_rs option or one for all: k1 "lower_upper" ratio bounds (or u: [1/u, u]), k2/k3 an upper
    # bound on the divergence.
    rollout_rs_threshold: str | float | None = None
    bypass_mode: bool = False  # skip the old-log-prob pass and use π_old = π_rollout
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"  # bypass mode's loss (reinforce: policy loss reinforce_is)

    @property
    def enabled(self) -> bool:
        """Whether any correction is on (each needs the engine's `rollout_log_probs`)."""
        return self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode


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
    # off-policy corrections for the engine's samples: TIS / MIS weights, bypass mode
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    use_pf_ppo: bool = False  # resample each batch by reward after the advantages (with adv_estimator=gae, as verl)
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
