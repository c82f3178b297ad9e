"""The algorithm functions accept hyflow's real config dataclasses, called the way the trainer and actor call them."""

import numpy as np
import pytest
import torch

from hyflow.algorithms import ADV_ESTIMATOR_REGISTRY, AdvantageEstimator, get_kl_controller, get_policy_loss_fn
from hyflow.config import ActorConfig, AlgorithmConfig, KLControlConfig, PolicyLossConfig


@pytest.mark.parametrize("estimator", [member.value for member in AdvantageEstimator])
def test_every_built_in_estimator_runs_from_one_dict_of_everything_the_trainer_has(estimator):
    torch.manual_seed(0)
    rewards = torch.zeros(6, 4)
    rewards[:, -1] = torch.rand(6)
    kwargs = {
        "token_level_rewards": rewards,
        "response_mask": torch.ones(6, 4),
        "values": torch.randn(6, 4),
        "index": np.array(["p", "p", "p", "q", "q", "q"], dtype=object),
        "reward_baselines": torch.rand(6),
        "gamma": 1.0,
        "lam": 0.95,
        "norm_adv_by_std_in_grpo": True,
        "config": AlgorithmConfig(adv_estimator=estimator),
    }
    advantages, returns = ADV_ESTIMATOR_REGISTRY[estimator](**kwargs)
    assert advantages.shape == returns.shape == (6, 4)
    assert torch.isfinite(advantages).all() and advantages.abs().sum() > 0


@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo", "gpg", "cispo", "clip_cov", "kl_cov"])
def test_every_built_in_policy_loss_accepts_the_actor_config(loss_mode):
    torch.manual_seed(1)
    config = ActorConfig(clip_ratio_high=0.28, policy_loss=PolicyLossConfig(loss_mode=loss_mode, clip_cov_lb=-1e9))
    old = torch.randn(4, 8) - 1
    new = (old + 0.1 * torch.randn(4, 8)).requires_grad_(True)
    loss, metrics = get_policy_loss_fn(loss_mode)(
        old, new, torch.randn(4, 8), torch.ones(4, 8), config.loss_agg_mode, config,
        batch_num_tokens=torch.tensor(32.0), global_batch_size=torch.tensor(4), dp_size=1, rollout_log_probs=old,
    )  # fmt: skip
    loss.backward()
    assert torch.isfinite(loss) and new.grad.abs().sum() > 0
    assert {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"} <= set(metrics)


def test_kl_controller_is_built_from_the_algorithm_config():
    assert get_kl_controller(KLControlConfig()).value == KLControlConfig().kl_coef
    adaptive = get_kl_controller(KLControlConfig(type="adaptive", kl_coef=0.2, target_kl=0.1, horizon=100))
    adaptive.update(current_kl=1.0, n_steps=10)
    assert adaptive.value > 0.2
