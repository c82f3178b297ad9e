"""Rollout correction through the actor update: the batch's IS weights and the bypass settings reach the loss."""

import copy

import pytest
import torch

from hyflow import fields as F
from hyflow.algorithms import get_policy_loss_fn
from hyflow.config import RolloutCorrectionConfig
from tests.workers.test_actor import build_actor


def _update(data, **overrides):
    actor = build_actor(overrides.pop("path"), **overrides)
    metrics = actor.update_policy(copy.deepcopy(data))
    return metrics, [p.detach().clone() for p in actor.module.parameters()]


def test_unit_is_weights_reproduce_the_uncorrected_update_exactly(tiny_model_path, ppo_batch):
    data = ppo_batch(batch_size=8, seed=11)
    plain_metrics, plain = _update(data, path=tiny_model_path)
    data.batch[F.ROLLOUT_IS_WEIGHTS] = torch.ones_like(data.batch[F.OLD_LOG_PROBS])
    weighted_metrics, weighted = _update(data, path=tiny_model_path)
    assert weighted_metrics["actor/pg_loss"] == plain_metrics["actor/pg_loss"]
    assert all(torch.equal(p, q) for p, q in zip(plain, weighted))


def test_the_batch_is_weights_scale_the_policy_loss(tiny_model_path, ppo_batch):
    data = ppo_batch(batch_size=8, seed=12)
    plain_metrics, _ = _update(data, path=tiny_model_path)
    data.batch[F.ROLLOUT_IS_WEIGHTS] = torch.full_like(data.batch[F.OLD_LOG_PROBS], 2.0)
    weighted_metrics, _ = _update(data, path=tiny_model_path)
    first = weighted_metrics["actor/pg_loss"][0]  # the first mini-batch sees the same weights in both runs
    assert first == pytest.approx(2.0 * plain_metrics["actor/pg_loss"][0], rel=1e-6)


def test_bypass_mode_settings_in_meta_info_reach_the_reinforce_is_loss(tiny_model_path, ppo_batch):
    data = ppo_batch(batch_size=8, seed=13)
    actor = build_actor(tiny_model_path)
    actor.policy_loss_fn = get_policy_loss_fn("reinforce_is")
    with pytest.raises(ValueError, match="rollout_correction"):
        actor.update_policy(copy.deepcopy(data))
    data.meta_info[F.ROLLOUT_CORRECTION] = RolloutCorrectionConfig(rollout_is="token", bypass_mode=True)
    before = [p.detach().clone() for p in actor.module.parameters()]
    metrics = actor.update_policy(data)
    assert "actor/rollout_corr/is_weight_mean" in metrics
    means = metrics["actor/rollout_corr/is_weight_mean"]  # one per optimizer step
    assert all(0 < mean <= 2.0 for mean in means)
    assert any(not torch.equal(p, q) for p, q in zip(before, actor.module.parameters()))
