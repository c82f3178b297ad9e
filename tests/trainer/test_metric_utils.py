"""verl's metric_utils names (hyflow.trainer.metric_utils): the bootstrap helpers and the re-exported metrics."""

import numpy as np
import pytest

from hyflow.trainer import metric_utils
from hyflow.trainer.metrics import compute_throughput_metrics


def test_bootstrap_gives_the_mean_and_spread_of_each_statistic_over_resamples():
    (mean, mean_std), (best, _) = metric_utils.bootstrap_metric([0, 1], 4, [np.mean, np.max], n_bootstrap=400)
    assert mean == pytest.approx(0.5, abs=0.05) and mean_std > 0
    assert best == pytest.approx(1 - 0.5**4, abs=0.05)  # the max of 4 coin flips is 1 unless all are 0


def test_bootstrap_is_the_same_for_the_same_seed_and_refuses_empty_data():
    assert metric_utils.bootstrap_metric([1, 5, 9], 2, [np.mean], seed=3) == metric_utils.bootstrap_metric(
        [1, 5, 9], 2, [np.mean], seed=3
    )
    with pytest.raises(ValueError, match="empty"):
        metric_utils.bootstrap_metric([], 1, [np.mean])


def test_majority_value_is_that_of_the_first_sample_with_the_most_common_vote():
    samples = [{"pred": "B", "acc": 0}, {"pred": "A", "acc": 1}, {"pred": "A", "acc": 0.5}]
    assert metric_utils.calc_maj_val(samples, vote_key="pred", val_key="acc") == 1


def test_verls_throughout_spelling_and_keywords_give_hyflows_throughput_metrics():
    import torch

    from hyflow.protocol import DataProto

    batch = DataProto.from_single_dict(
        {"responses": torch.ones(2, 3), "attention_mask": torch.ones(2, 5), "response_mask": torch.ones(2, 3)}
    )
    timing = {"step": 2.0}
    expected = compute_throughput_metrics(batch, timing, n_devices=2)
    assert metric_utils.compute_throughout_metrics(batch, timing_raw=timing, n_gpus=2) == expected
