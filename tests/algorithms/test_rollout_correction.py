"""Rollout correction: truncated and IcePop-masked IS weights and rejection masks equal a hand computation."""

import math

import pytest
import torch

from hyflow.algorithms.rollout_correction import (
    correction_metrics,
    parse_is_threshold,
    parse_rejection_rules,
    rejection_mask,
    rollout_is_weights,
    threshold_hits,
)

# Two responses of 3 tokens; the second has one padding token. Log-ratios log r = target − behaviour:
#   response 0: [0.5, -0.2, 1.5]      response 1: [0.1, -1.0, (pad)]
TARGET = torch.tensor([[-1.0, -2.0, -0.5], [-0.9, -3.0, -7.0]])
BEHAVIOUR = torch.tensor([[-1.5, -1.8, -2.0], [-1.0, -2.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_token_level_weights_are_each_tokens_ratio_truncated_at_the_threshold():
    weights = rollout_is_weights(TARGET, BEHAVIOUR, MASK, "token", threshold=2.0)
    expected = torch.tensor([[math.exp(0.5), math.exp(-0.2), 2.0], [math.exp(0.1), math.exp(-1.0), 0.0]])
    torch.testing.assert_close(weights, expected)


def test_sequence_level_weights_are_the_product_of_the_ratios_on_every_token():
    weights = rollout_is_weights(TARGET, BEHAVIOUR, MASK, "sequence", threshold=5.0)
    first, second = min(math.exp(0.5 - 0.2 + 1.5), 5.0), math.exp(0.1 - 1.0)
    torch.testing.assert_close(weights, torch.tensor([[first] * 3, [second, second, 0.0]]))


def test_batch_normalised_token_weights_average_one_over_the_response_tokens():
    weights = rollout_is_weights(TARGET, BEHAVIOUR, MASK, "token", threshold=2.0, batch_normalize=True)
    assert weights[MASK.bool()].mean().item() == pytest.approx(1.0)
    assert weights[1, 2].item() == 0.0


def test_token_k1_rejects_tokens_whose_ratio_leaves_the_bounds():
    kept = rejection_mask(TARGET, BEHAVIOUR, MASK, parse_rejection_rules("token_k1", "0.5_2.0"))
    # ratios: e^0.5=1.65 e^-0.2=0.82 e^1.5=4.48 | e^0.1=1.11 e^-1=0.37 -> the third and the fifth are out
    torch.testing.assert_close(kept, torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_seq_max_k2_rejects_the_whole_response_with_one_far_token():
    kept = rejection_mask(TARGET, BEHAVIOUR, MASK, parse_rejection_rules("seq_max_k2", 0.6))
    # max ½(log r)²: response 0 -> ½·1.5² = 1.125 > 0.6 (rejected); response 1 -> ½·1² = 0.5 (kept)
    torch.testing.assert_close(kept, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))


def test_a_single_float_k1_threshold_means_the_reciprocal_lower_bound():
    (rule,) = parse_rejection_rules("seq_mean_k1", 2.0)
    assert (rule.lower, rule.upper) == (0.5, 2.0)


@pytest.mark.parametrize(
    ("options", "thresholds", "message"),
    [
        ("token_k9", 1.0, "unknown option"),
        ("token_k1,token_k2", "1,2,3", "3 entries for 2"),
        ("token_k2", "-1", "positive"),
    ],
)
def test_bad_rejection_settings_name_the_key_and_the_allowed_values(options, thresholds, message):
    with pytest.raises(ValueError, match=message):
        parse_rejection_rules(options, thresholds)


def test_correction_metrics_report_kl_estimates_weights_and_the_rejected_share():
    weights = rollout_is_weights(TARGET, BEHAVIOUR, MASK, "token", threshold=2.0)
    kept = rejection_mask(TARGET, BEHAVIOUR, MASK, parse_rejection_rules("token_k1", "0.5_2.0"))
    metrics = correction_metrics(TARGET, BEHAVIOUR, MASK, weights, kept, threshold=2.0)
    log_ratios = [0.5, -0.2, 1.5, 0.1, -1.0]
    assert metrics["rollout_corr/kl_k1"].item() == pytest.approx(-sum(log_ratios) / 5)
    assert metrics["rollout_corr/is_clipped_fraction"].item() == pytest.approx(1 / 5)
    assert metrics["rollout_corr/rejected_token_fraction"].item() == pytest.approx(2 / 5)
    assert metrics["rollout_corr/is_weight_max"].item() == pytest.approx(2.0)


def test_icepop_token_weights_are_the_ratio_inside_the_band_and_zero_outside():
    weights = rollout_is_weights(TARGET, BEHAVIOUR, MASK, "token", threshold="0.5_2.0")
    # ratios: e^0.5=1.65 e^-0.2=0.82 e^1.5=4.48 | e^0.1=1.11 e^-1=0.37 -> the third is above, the fifth below
    expected = torch.tensor([[math.exp(0.5), math.exp(-0.2), 0.0], [math.exp(0.1), 0.0, 0.0]])
    torch.testing.assert_close(weights, expected)


def test_icepop_sequence_weights_zero_every_token_of_a_response_whose_product_leaves_the_band():
    weights = rollout_is_weights(TARGET, BEHAVIOUR, MASK, "sequence", threshold="0.3_5.0")
    # ρ: response 0 e^1.8 = 6.05 (above 5: zeroed), response 1 e^-0.9 = 0.41 (kept, not truncated)
    second = math.exp(0.1 - 1.0)
    torch.testing.assert_close(weights, torch.tensor([[0.0] * 3, [second, second, 0.0]]))


def test_icepop_gives_a_masked_token_no_gradient_and_the_others_their_ratio():
    log_prob = torch.zeros(2, 3, requires_grad=True)
    weights = rollout_is_weights(TARGET, BEHAVIOUR, MASK, "token", threshold="0.5_2.0")
    (-(weights * log_prob * MASK).sum()).backward()
    assert log_prob.grad[0, 2].item() == 0.0 and log_prob.grad[1, 1].item() == 0.0
    assert log_prob.grad[0, 0].item() == pytest.approx(-math.exp(0.5), rel=1e-5)


@pytest.mark.parametrize(
    ("threshold", "expected"), [(2.0, (2.0, None)), ("2.0", (2.0, None)), ("0.5_5.0", (5.0, 0.5)), (3, (3.0, None))]
)
def test_an_is_threshold_is_a_truncation_bound_or_icepop_bounds(threshold, expected):
    assert parse_is_threshold(threshold) == expected


@pytest.mark.parametrize(
    ("threshold", "error", "message"),
    [
        (0.0, ValueError, "must be positive"),
        ("5.0_0.5", ValueError, "0 < lower <= upper"),
        ("0_2", ValueError, "0 < lower <= upper"),
        ("a_b", ValueError, "Fix: use e.g. 2.0"),
        (True, TypeError, "is a bool"),
    ],
)
def test_a_bad_is_threshold_names_the_key_and_the_fix(threshold, error, message):
    with pytest.raises(error, match=message) as caught:
        parse_is_threshold(threshold)
    assert "algorithm.rollout_correction.rollout_is_threshold" in str(caught.value) and "Fix:" in str(caught.value)


def test_with_icepop_bounds_the_clipped_fraction_counts_the_tokens_outside_the_band():
    weights = rollout_is_weights(TARGET, BEHAVIOUR, MASK, "token", threshold="0.5_2.0")
    metrics = correction_metrics(TARGET, BEHAVIOUR, MASK, weights, None, threshold="0.5_2.0")
    assert metrics["rollout_corr/is_clipped_fraction"].item() == pytest.approx(2 / 5)
    assert threshold_hits(torch.tensor([0.0, -1.0, 0.5, 1.0]), "0.5_2.0").tolist() == [False, True, False, True]
