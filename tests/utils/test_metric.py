"""Metrics that know how they combine (hyflow.utils.metric): mean, sum, min, max, over micro-batches and ranks."""

import numpy as np
import pytest
import torch

from hyflow.utils.metric import AggregationType, Metric, append_to_dict, reduce_metrics


def test_a_partial_sum_loss_reported_per_micro_batch_reduces_to_the_mini_batch_loss():
    token_losses = torch.arange(12.0)
    metrics = {}
    for part in token_losses.split(3):
        append_to_dict(metrics, {"critic/vf_loss": Metric("sum", part.sum() / 12), "lr": 0.1})
    reduced = reduce_metrics(metrics)
    assert reduced["critic/vf_loss"] == pytest.approx(token_losses.mean().item())
    assert reduced["lr"] == pytest.approx(0.1)


def test_plain_lists_reduce_by_the_keys_name():
    reduced = reduce_metrics({"reward/max": [1, 5], "len/min": [3, 2], "score": [1, 2]})
    assert reduced == {"reward/max": 5, "len/min": 2, "score": 1.5}


def test_across_ranks_sums_average_the_ranks_and_extremes_take_all_values():
    ranks = [Metric("sum", [1.0, 2.0]), Metric("sum", [3.0, 4.0])]
    assert Metric.aggregate_dp(ranks) == pytest.approx(5.0)  # (1+3)/2 + (2+4)/2
    assert Metric.aggregate_dp([Metric("max", [1.0, 9.0]), Metric("max", [3.0, 4.0])]) == 9.0


def test_ranks_with_different_numbers_of_values_are_refused():
    with pytest.raises(ValueError, match=r"same number of values; got \[2, 1\]"):
        Metric.aggregate_dp([Metric("mean", [1.0, 2.0]), Metric("mean", 1.0)])


def test_a_value_must_be_a_scalar_number():
    metric = Metric(AggregationType.MEAN, np.float32(2.0))
    with pytest.raises(ValueError, match=r"scalar; got shape \(2,\)"):
        metric.append(torch.ones(2))
    with pytest.raises(ValueError, match="must be a number"):
        metric.append("x")


def test_merging_metrics_that_combine_differently_is_refused():
    with pytest.raises(ValueError, match="cannot merge a sum metric into a mean one"):
        Metric("mean", 1.0).extend(Metric("sum", 2.0))


def test_an_unknown_aggregation_lists_the_allowed_ones():
    with pytest.raises(ValueError, match=r"'median' is not one of \['mean', 'sum', 'min', 'max'\]"):
        Metric("median")
