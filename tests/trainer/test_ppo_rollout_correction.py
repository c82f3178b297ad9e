"""PPOTrainer with `algorithm.rollout_correction`: the tiny GRPO run of `ppo_testkit`, local backend, 2 steps."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.ppo_testkit import actor_parameters, build_assets_with_reward, train

KEY = "algorithm.rollout_correction"
LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=True"

pytestmark = pytest.mark.usefixtures("in_tmp_path")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_assets_with_reward(tmp_path_factory.mktemp("rollout_correction"))


@pytest.mark.timeout(120)
def test_decoupled_token_is_logs_the_off_policy_metrics_every_step(assets, tmp_path):
    overrides = [LOG_PROBS, f"{KEY}.rollout_is=token", f"{KEY}.rollout_rs=token_k1", f"{KEY}.rollout_rs_threshold=5.0"]
    steps, trainer, before = train(assets, tmp_path, *overrides)
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        metrics = step["data"]
        assert "timing_s/old_log_prob" in metrics
        # the engine and the actor score the same tokens with the same weights: π_old ≈ π_rollout
        assert abs(metrics["rollout_corr/kl_k1"]) < 1e-3
        assert metrics["rollout_corr/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert metrics["rollout_corr/rejected_token_fraction"] == 0.0
        assert "rollout_corr/is_clipped_fraction" in metrics and "rollout_corr/kl_k3" in metrics
    after = actor_parameters(trainer)
    assert any(not torch.equal(before[name], after[name]) for name in before)


@pytest.mark.timeout(120)
def test_bypass_mode_with_reinforce_skips_the_old_log_prob_pass_and_trains(assets, tmp_path):
    overrides = [LOG_PROBS, f"{KEY}.bypass_mode=True", f"{KEY}.loss_type=reinforce", f"{KEY}.rollout_is=sequence"]
    steps, trainer, before = train(assets, tmp_path, *overrides, "trainer.total_training_steps=1")
    assert trainer.recompute_old_log_prob is False
    metrics = steps[0]["data"]
    assert "timing_s/old_log_prob" not in metrics
    assert metrics["actor/rollout_corr/is_weight_mean"] == pytest.approx(1.0, abs=1e-2)
    after = actor_parameters(trainer)
    assert any(not torch.equal(before[name], after[name]) for name in before)
