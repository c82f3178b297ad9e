"""PPOTrainer with `algorithm.rollout_correction`: the tiny GRPO run of `ppo_testkit`, local backend, 2 steps."""

from __future__ import annotations

import pytest
import torch

from hyflow.trainer.ppo_trainer import PPOTrainer
from tests.trainer.ppo_testkit import actor_parameters, build_assets_with_reward, read_metrics, tiny_config, train

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
    assert "timing_s/old_log_prob" not in metrics and "actor/entropy" in metrics  # reported by the update
    assert metrics["actor/rollout_corr/is_weight_mean"] == pytest.approx(1.0, abs=1e-2)
    after = actor_parameters(trainer)
    assert any(not torch.equal(before[name], after[name]) for name in before)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bypass_mode_settings_reach_the_loss_on_two_ray_workers(ray_started_here, assets, tmp_path):
    bypass = [f"{KEY}.bypass_mode=True", f"{KEY}.loss_type=reinforce", f"{KEY}.rollout_is=token"]
    config = tiny_config(
        assets,
        tmp_path,
        f"custom_reward_function.path={assets['reward']}",
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",
        "trainer.ray_init.num_cpus=2",
        "trainer.total_training_steps=1",
        LOG_PROBS,
        *bypass,
    )
    trainer = PPOTrainer(config)
    try:
        trainer.init_workers()
        trainer.fit()
    finally:
        trainer.close()
    (step,) = read_metrics(trainer.tracking.log_dir)
    assert "timing_s/old_log_prob" not in step["data"]
    assert step["data"]["actor/rollout_corr/is_weight_mean"] == pytest.approx(1.0, abs=1e-2)
