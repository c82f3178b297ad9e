"""verl's rollout-correction API on hyflow's weights and masks, with verl's diagnostics checked by hand."""

import math

import pytest
import torch

from hyflow.algorithms.rollout_corr_helper import (
    SUPPORTED_ROLLOUT_RS_OPTIONS,
    compute_is_metrics,
    compute_offpolicy_metrics,
    compute_rollout_correction_and_rejection_mask,
)
from hyflow.algorithms.rollout_correction import rollout_is_weights


def _pair(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """old / rollout log-probs whose per-token ratio π_old / π_rollout is `ratios`, and a full mask."""
    rollout = torch.full((len(ratios), len(ratios[0])), -1.0)
    return rollout + torch.tensor(ratios).log(), rollout, torch.ones_like(rollout)


def test_truncated_weights_are_hyflows_and_icepop_zeroes_the_ratios_outside_the_band():
    old, rollout, mask = _pair([[0.4, 0.8, 6.0]])
    tis, _, _ = compute_rollout_correction_and_rejection_mask(old, rollout, mask, "token", 2.0)
    torch.testing.assert_close(tis.batch["rollout_is_weights"], rollout_is_weights(old, rollout, mask, "token", 2.0))
    icepop, kept, metrics = compute_rollout_correction_and_rejection_mask(old, rollout, mask, "token", "0.5_5.0")
    torch.testing.assert_close(icepop.batch["rollout_is_weights"], torch.tensor([[0.0, 0.8, 0.0]]))
    assert torch.equal(kept, mask) and metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 3)
    weights = torch.tensor([0.0, 0.8, 0.0])
    assert metrics["rollout_corr/rollout_is_std"] == pytest.approx(weights.std(unbiased=False).item(), abs=1e-6)
    ess = 1 / ((weights / weights.mean()) ** 2).mean()
    assert metrics["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(ess.item(), abs=1e-6)


def test_sequence_weights_are_one_value_per_response():
    old, rollout, mask = _pair([[1.2, 1.1], [0.5, 0.9]])
    weights, _, metrics = compute_rollout_correction_and_rejection_mask(old, rollout, mask, "sequence", 5.0)
    expected = torch.tensor([[1.32, 1.32], [0.45, 0.45]])
    torch.testing.assert_close(weights.batch["rollout_is_weights"], expected)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(1.32, rel=1e-5)


def test_rejection_masks_out_of_bound_responses_and_keeps_the_true_weights():
    old, rollout, mask = _pair([[0.37] * 3, [1.65] * 3])
    weights, kept, metrics = compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, "token", 2.0, rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"
    )
    assert kept.tolist() == [[0, 0, 0], [1, 1, 1]]
    assert weights.batch["rollout_is_weights"][0, 0].item() == pytest.approx(0.37, rel=1e-5)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.5)
    assert metrics["rollout_corr/rollout_rs_token_k1_mean"] == pytest.approx(-(math.log(0.37) + math.log(1.65)) / 2)


@pytest.mark.parametrize("option", sorted(SUPPORTED_ROLLOUT_RS_OPTIONS))
def test_every_option_reports_its_statistic_and_fractions(option):
    old, rollout, mask = _pair([[0.9, 1.1, 1.3], [1.0, 0.7, 1.0]])
    threshold = "0.5_2.0" if option.endswith("k1") else 1.0
    _, _, metrics = compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, rollout_rs=option, rollout_rs_threshold=threshold
    )
    for suffix in ("mean", "max", "min", "masked_fraction", "seq_masked_fraction"):
        assert isinstance(metrics[f"rollout_corr/rollout_rs_{option}_{suffix}"], float)


def test_off_policy_metrics_follow_their_formulas():
    old, rollout, mask = _pair([[2.0, 0.5], [1.0, 1.0]])
    metrics = compute_offpolicy_metrics(old, rollout, mask)
    log_r = (old - rollout).flatten()
    assert metrics["kl"] == pytest.approx(-log_r.mean().item())
    assert metrics["k3_kl"] == pytest.approx((log_r.exp() - 1 - log_r).mean().item())
    assert metrics["chi2_token"] == pytest.approx((log_r.exp() ** 2).mean().item() - 1)
    assert metrics["chi2_seq"] == pytest.approx(((1.0**2) + 1.0**2) / 2 - 1, abs=1e-6)  # ρ = 2·0.5 and 1·1
    assert metrics["training_ppl"] == pytest.approx(torch.exp(-old.mean(-1)).mean().item())
    assert set(compute_offpolicy_metrics(old, None, mask)) == {"training_ppl", "training_log_ppl"}


def test_sequence_fraction_high_reads_the_raw_weights():
    raw = torch.tensor([[1.0, 6.0], [0.9, 1.1]])
    metrics = compute_is_metrics(raw.clamp(max=2.0), raw, raw.log(), torch.ones_like(raw), "token", 2.0)
    assert metrics["rollout_is_seq_fraction_high"] == pytest.approx(0.5)


@pytest.mark.parametrize(("threshold", "error"), [(True, TypeError), ("2_1", ValueError), ("x", ValueError)])
def test_a_bad_is_threshold_is_refused(threshold, error):
    old, rollout, mask = _pair([[1.0]])
    with pytest.raises(error, match="rollout_is_threshold"):
        compute_rollout_correction_and_rejection_mask(old, rollout, mask, "token", threshold)


def test_without_corrections_the_mask_is_unchanged_and_the_diagnostics_remain():
    old, rollout, mask = _pair([[1.2, 0.8]])
    weights, kept, metrics = compute_rollout_correction_and_rejection_mask(old, rollout, mask)
    assert weights is None and torch.equal(kept, mask) and "rollout_corr/kl" in metrics
