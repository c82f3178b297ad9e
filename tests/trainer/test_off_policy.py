"""The controller's rollout-correction stage: decoupled mode's weights and mask, bypass mode's old log-probs."""

import pytest
import torch

from hyflow import fields as F
from hyflow.algorithms.rollout_correction import parse_rejection_rules, rejection_mask, rollout_is_weights
from hyflow.config import RolloutCorrectionConfig
from hyflow.protocol import DataProto
from hyflow.trainer.off_policy import correct

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -1.2, 0.0, 0.0], [-2.0, -0.1, -0.7, -1.5]])
ROLLOUT = OLD + torch.tensor([[0.1, -0.9, 0.0, 0.0], [0.05, 0.02, 0.0, 0.0], [-0.4, 0.3, 0.0, 2.0]])


def _batch(rollout=ROLLOUT) -> DataProto:
    return DataProto.from_dict(
        {F.OLD_LOG_PROBS: OLD.clone(), F.ROLLOUT_LOG_PROBS: rollout.clone(), F.RESPONSE_MASK: MASK.clone()}
    )


def test_decoupled_mode_adds_the_is_weights_of_old_against_rollout_and_folds_rejection_into_the_mask():
    correction = RolloutCorrectionConfig(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.5_1.5")
    batch, metrics = correct(_batch(), correction)
    torch.testing.assert_close(batch.batch[F.ROLLOUT_IS_WEIGHTS], rollout_is_weights(OLD, ROLLOUT, MASK, "token", 2.0))
    kept = rejection_mask(OLD, ROLLOUT, MASK, parse_rejection_rules("token_k1", "0.5_1.5"))
    assert torch.equal(batch.batch[F.RESPONSE_MASK], kept)
    assert kept.sum() == MASK.sum() - 2  # the tokens with |log r| = 0.9 and 2.0 are rejected
    assert metrics["rollout_corr/rejected_token_fraction"] == pytest.approx(2 / 9)
    assert {
        "rollout_corr/kl_k1",
        "rollout_corr/kl_k3",
        "rollout_corr/is_weight_mean",
        "rollout_corr/is_weight_max",
    } <= set(metrics)
    assert all(isinstance(value, float) for value in metrics.values())


def test_decoupled_mode_with_icepop_bounds_zeroes_the_weights_of_ratios_outside_the_band():
    correction = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold="0.5_1.5")
    batch, metrics = correct(_batch(), correction)
    weights = batch.batch[F.ROLLOUT_IS_WEIGHTS]
    ratio = torch.exp(OLD - ROLLOUT)
    # log r = -0.1, 0.9, 0 | -0.05, -0.02 | 0.4, -0.3, 0, -2.0: the tokens with log r = 0.9 and -2.0 leave [0.5, 1.5]
    outside = MASK.bool() & ((ratio < 0.5) | (ratio > 1.5))
    assert outside.sum() == 2 and torch.all(weights[outside] == 0)
    torch.testing.assert_close(weights[MASK.bool() & ~outside], ratio[MASK.bool() & ~outside])
    assert torch.equal(batch.batch[F.RESPONSE_MASK], MASK)
    assert metrics["rollout_corr/is_clipped_fraction"] == pytest.approx(2 / 9)


def test_on_policy_samples_get_weight_one_and_nothing_rejected():
    correction = RolloutCorrectionConfig(rollout_is="sequence", rollout_rs="seq_max_k2", rollout_rs_threshold=0.01)
    batch, metrics = correct(_batch(rollout=OLD), correction)
    assert torch.equal(batch.batch[F.ROLLOUT_IS_WEIGHTS], MASK.float())
    assert torch.equal(batch.batch[F.RESPONSE_MASK], MASK)
    assert metrics["rollout_corr/kl_k1"] == 0.0 and metrics["rollout_corr/rejected_token_fraction"] == 0.0


def test_bypass_mode_uses_the_engine_log_probs_as_old_and_sends_the_settings_along():
    correction = RolloutCorrectionConfig(rollout_is="token", bypass_mode=True, loss_type="reinforce")
    batch, metrics = correct(_batch(), correction)
    assert torch.equal(batch.batch[F.OLD_LOG_PROBS], ROLLOUT)
    assert batch.meta_info[F.ROLLOUT_CORRECTION] is correction
    assert F.ROLLOUT_IS_WEIGHTS not in batch.batch.keys() and metrics == {}  # noqa: SIM118 (the loss weighs π_θ)


def test_no_correction_leaves_the_batch_as_it_is():
    batch, metrics = correct(_batch(), RolloutCorrectionConfig())
    assert sorted(batch.batch.keys()) == sorted([F.OLD_LOG_PROBS, F.ROLLOUT_LOG_PROBS, F.RESPONSE_MASK])
    assert metrics == {}


def test_a_batch_without_the_engine_log_probs_is_an_error_naming_the_key():
    batch = _batch()
    batch.pop(batch_keys=[F.ROLLOUT_LOG_PROBS])
    with pytest.raises(ValueError, match="calculate_log_probs=True"):
        correct(batch, RolloutCorrectionConfig(rollout_is="token"))
