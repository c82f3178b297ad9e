"""hyflow.algorithms: the RL math as pure tensor functions, with verl's names and signatures.

- advantage estimators, registered by name: `get_adv_estimator_fn("grpo")`, `@register_adv_est("my_est")`
  (`advantages.py`: GAE, REINFORCE++, ReMax; `group_advantages.py`: GRPO, RLOO, REINFORCE++-baseline, OPO, GPG,
  GRPO pass@k)
- policy losses, registered by name: `get_policy_loss_fn("vanilla")`, `@register_policy_loss("my_loss")`
  (`policy_losses.py`: vanilla PPO with clip-higher and dual-clip, GSPO, GPG, CISPO, DRO, REINFORCE with truncated IS
  weights for rollout correction's bypass mode; `covariance_losses.py`:
  Clip-Cov, KL-Cov)
- the mixture-of-experts router's load-balancing loss and expert load (`router_balance.py`)
- PF-PPO's resampling by reward (`pf_ppo.py`: `pf_ppo_sample_indices`)
- `agg_loss` (token / sequence normalisation), `kl_penalty` and the KL controllers, `compute_value_loss`,
  `entropy_from_logits`, and the masked statistics they are built from.
"""

from hyflow.algorithms.advantages import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    fold_masked_rewards,
)
from hyflow.algorithms.aggregation import LOSS_AGG_MODES, agg_loss
from hyflow.algorithms.covariance_losses import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from hyflow.algorithms.group_advantages import (
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from hyflow.algorithms.kl import (
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty_to_rewards,
    get_kl_controller,
    kl_penalty,
)
from hyflow.algorithms.logits import entropy_from_logits, log_probs_from_logits
from hyflow.algorithms.masked import masked_mean, masked_sum, masked_var, masked_whiten
from hyflow.algorithms.policy_losses import (
    compute_policy_loss_cispo,
    compute_policy_loss_dro,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_reinforce_is,
    compute_policy_loss_vanilla,
)
from hyflow.algorithms.registry import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    AdvantageEstimator,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)
from hyflow.algorithms.router_balance import expert_load, load_balancing_loss
from hyflow.algorithms.value import compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty_to_rewards",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dro",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce_is",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "expert_load",
    "fold_masked_rewards",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "load_balancing_loss",
    "log_probs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_est",
    "register_policy_loss",
]
