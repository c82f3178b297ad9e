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


def _batch(prompt_tokens: list[int], response_tokens: list[int]):
    import torch

    from hyflow.protocol import DataProto

    attention_mask = torch.zeros(len(prompt_tokens), 6)
    for i, (p, r) in enumerate(zip(prompt_tokens, response_tokens, strict=True)):
        attention_mask[i, 3 - p : 3 + r] = 1
    return DataProto.from_single_dict(
        {"responses": torch.ones(len(prompt_tokens), 3), "attention_mask": attention_mask}
    )


def test_throughput_counts_the_tokens_the_trainer_recorded_when_there_are_any():
    batch = _batch([3, 1], [2, 3])
    batch.meta_info["global_token_num"] = [100, 200, 300]
    assert metric_utils.compute_throughout_metrics(batch, {"step": 2.0}, n_gpus=2)["perf/throughput"] == 150.0


def test_timing_divides_generation_by_response_tokens_and_the_rest_by_all_tokens():
    metrics = metric_utils.compute_timing_metrics(_batch([3, 1], [2, 3]), {"gen": 0.5, "ref": 0.9, "reward": 1.0})
    assert metrics["timing_per_token_ms/gen"] == pytest.approx(500 / 5)
    assert metrics["timing_per_token_ms/ref"] == pytest.approx(900 / 9)
    assert metrics["timing_s/reward"] == 1.0 and "timing_per_token_ms/reward" not in metrics


def test_timing_per_token_is_zero_when_there_are_no_tokens():
    metrics = metric_utils.compute_timing_metrics(_batch([0, 0], [0, 0]), {"gen": 0.5})
    assert metrics["timing_per_token_ms/gen"] == 0.0 and metrics["timing_s/gen"] == 0.5


def test_verls_validation_metrics_are_hyflows_values_nested_by_source_and_variable():
    from hyflow.trainer.validation import process_validation_metrics as flat_metrics

    sources, uids = ["openai/gsm8k"] * 4, ["a", "a", "b", "b"]
    infos = {"reward": [1.0, 0.0, 1.0, 1.0], "pred": ["4", "5", "7", "7"]}
    nested = metric_utils.process_validation_metrics(sources, uids, infos, seed=1)
    flat = flat_metrics(sources, uids, infos, seed=1)
    assert nested["openai/gsm8k"]["reward"]["mean@2"] == pytest.approx(0.75)
    for key, value in flat.items():  # e.g. val-core/openai/gsm8k/reward/mean@2
        assert nested["openai/gsm8k"]["reward"][key.split("/openai/gsm8k/reward/")[1]] == value
    assert len(flat) == len(nested["openai/gsm8k"]["reward"])
