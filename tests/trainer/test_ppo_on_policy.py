"""PPOTrainer with one optimizer step per batch: the old-log-prob pass is skipped and the update is unchanged.

The tiny GRPO run of `test_ppo_trainer.py` with `ppo_mini_batch_size = data.train_batch_size = 4` prompts (× 2
samples) and one epoch, so `actor_rollout_ref.actor.recompute_old_log_prob=auto` skips the pass.
"""

from __future__ import annotations

import logging

import pytest
import torch

from tests.trainer.ppo_testkit import actor_parameters, build_assets_with_reward, train

ONE_STEP_PER_BATCH = ["actor_rollout_ref.actor.ppo_mini_batch_size=4"]


pytestmark = pytest.mark.usefixtures("in_tmp_path")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_assets_with_reward(tmp_path_factory.mktemp("on_policy"))


@pytest.mark.timeout(120)
def test_grpo_with_one_update_per_batch_skips_the_old_log_prob_pass_and_still_reports_entropy(assets, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="hyflow.trainer.ppo_trainer"):
        steps, trainer, before = train(assets, tmp_path, *ONE_STEP_PER_BATCH)

    assert trainer.recompute_old_log_prob is False
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        metrics = step["data"]
        assert "timing_s/old_log_prob" not in metrics and "timing_per_token_ms/old_log_prob" not in metrics
        for key in ("actor/entropy", "actor/pg_loss", "actor/grad_norm", "timing_s/update_actor", "timing_s/gen"):
            assert key in metrics, key
        assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0  # the ratio is exactly 1
    skipped = [r for r in caplog.records if r.getMessage().startswith("skipping the old-log-prob pass")]
    assert len(skipped) == 1
    assert "ppo_mini_batch_size=4 = data.train_batch_size=4" in skipped[0].getMessage()
    after = actor_parameters(trainer)
    assert any(not torch.equal(before[name], after[name]) for name in before)


@pytest.mark.timeout(120)
def test_skipping_the_old_log_prob_pass_gives_the_same_first_update_as_recomputing_it(assets, tmp_path):
    runs = {}
    for setting in ("True", "auto"):
        overrides = [
            *ONE_STEP_PER_BATCH,
            "trainer.total_training_steps=1",
            f"trainer.experiment_name=recompute_{setting}",  # a log folder of its own
            f"actor_rollout_ref.actor.recompute_old_log_prob={setting}",
        ]
        steps, trainer, _ = train(assets, tmp_path / setting, *overrides)
        runs[setting] = (steps[0]["data"], actor_parameters(trainer))
    (recomputed, recomputed_params), (skipped, skipped_params) = runs["True"], runs["auto"]

    assert "timing_s/old_log_prob" in recomputed and "timing_s/old_log_prob" not in skipped
    for key in ("critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert skipped[key] == pytest.approx(recomputed[key], rel=1e-4, abs=1e-6), key
    for name, param in skipped_params.items():
        torch.testing.assert_close(param, recomputed_params[name], rtol=1e-4, atol=1e-5)  # lr 1e-3: far below a step
