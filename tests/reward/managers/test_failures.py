"""Reward failures are visible: crashes, hangs, non-numbers and NaN/inf name the function and row; failure flags
become training metrics; a scorer that fails on every row stops the run."""

from __future__ import annotations

import math
import os
import re
import textwrap
import time

import numpy as np
import pytest

from hyflow.reward import compute_reward
from hyflow.reward.custom import load_custom_function
from hyflow.reward.managers.base import RewardFunctionError
from hyflow.reward.managers.batch import BatchRewardManager
from hyflow.reward.managers.naive import NaiveRewardManager
from hyflow.reward.managers.prime import PrimeRewardManager
from hyflow.reward.metrics import reward_metrics
from hyflow.trainer import stages
from hyflow.trainer.validation import process_validation_metrics

pytestmark = pytest.mark.timeout(120)


def exits_on_b(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "b":
        os._exit(3)
    return 1.0


def test_naive_reports_a_function_that_calls_os_exit_naming_it_and_the_row(make_batch, tokenizer):
    data = make_batch(["a", "b"], ["1", "2"], ["arith", "arith"])
    manager = NaiveRewardManager(tokenizer, compute_score=exits_on_b)
    with pytest.raises(RewardFunctionError, match=r"exits_on_b, row 1 \(data_source='arith'.*exit code 3"):
        manager(data)
    assert manager(make_batch(["a"], ["1"], ["arith"])).sum().item() == 1.0  # a fresh child serves the next call


def test_naive_stops_a_call_past_timeout_s(make_batch, tokenizer):
    def slow(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(60)

    manager = NaiveRewardManager(tokenizer, compute_score=slow, timeout_s=1)
    message = r"slow, row 0 .*no result within reward_model.timeout_s=1s.* raise reward_model.timeout_s"
    with pytest.raises(RewardFunctionError, match=message):
        manager(make_batch(["a"], ["1"], ["arith"]))


@pytest.mark.parametrize("value", ["1.0", None, [1.0]])
def test_a_non_number_names_the_function_the_row_and_the_value(make_batch, tokenizer, value):
    def odd(data_source, solution_str, ground_truth, extra_info=None):
        return value if solution_str == "b" else 1.0

    with pytest.raises(RewardFunctionError, match=rf"odd, row 1 .*returned {value!r}".replace("[", r"\[")):
        NaiveRewardManager(tokenizer, compute_score=odd)(make_batch(["a", "b"], ["1", "2"], ["arith", "arith"]))


def nan_on_b(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": math.nan if solution_str == "b" else 1.0, "acc": 1.0}


def test_a_nan_score_is_an_error_naming_function_row_data_source_and_value(make_batch, tokenizer):
    data = make_batch(["a", "b"], ["1", "2"], ["arith", "my/source"])
    with pytest.raises(RewardFunctionError, match=r"nan_on_b, row 1 \(data_source='my/source'.*non-finite score nan"):
        NaiveRewardManager(tokenizer, compute_score=nan_on_b)(data)


def test_on_non_finite_zero_scores_it_zero_and_counts_it_in_the_training_metrics(make_batch, tokenizer):
    data = make_batch(["a", "b", "c"], ["1", "2", "3"], ["arith"] * 3)
    manager = BatchRewardManager(tokenizer, compute_score=lambda **kw: [float("inf"), 0.5, math.nan],
                                 on_non_finite="zero", stop_at_failed_fraction=1.0)  # fmt: skip
    batch, _ = stages.attach_reward(data, manager)
    assert batch.batch["token_level_scores"].sum(-1).tolist() == [0.0, 0.5, 0.0]
    assert stages.reward_extra_metrics(batch)["reward/non_finite_count"] == 2.0


def huge_on_b(data_source, solution_str, ground_truth, extra_info=None):
    return 1e308 if solution_str == "b" else 1.0  # finite in float64, overflows the float32 reward tensor


def test_a_score_that_overflows_float32_names_the_function_the_row_and_the_value(make_batch, tokenizer):
    data = make_batch(["a", "b"], ["1", "2"], ["arith", "my/source"])
    with pytest.raises(
        RewardFunctionError, match=r"huge_on_b, row 1 \(data_source='my/source'.*1e\+308, which overflows"
    ):
        NaiveRewardManager(tokenizer, compute_score=huge_on_b)(data)
    manager = NaiveRewardManager(tokenizer, compute_score=huge_on_b, on_non_finite="zero", stop_at_failed_fraction=2.0)
    batch, _ = stages.attach_reward(data, manager)
    assert batch.batch["token_level_scores"].sum(-1).tolist() == [1.0, 0.0]
    assert stages.reward_extra_metrics(batch)["reward/non_finite_count"] == 1.0


def odd_extras(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 1.0, "margin": math.inf if solution_str == "b" else 0.5, "note": f"saw {solution_str}"}


def test_extras_no_metric_can_hold_are_named_once_and_infinite_ones_are_counted(make_batch, tokenizer, caplog):
    manager = NaiveRewardManager(tokenizer, compute_score=odd_extras)
    data = make_batch(["a", "b", "b"], ["1", "2", "3"], ["arith"] * 3)
    with caplog.at_level("WARNING", logger="hyflow.reward.managers.base"):
        batch, _ = stages.attach_reward(data, manager)
        manager(data)  # the same extras again: not named again
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2
    assert re.search(r"odd_extras, row 1 .*extra field 'margin' = inf \(float\)", warnings[0] + warnings[1])
    assert re.search(r"odd_extras, row 0 .*extra field 'note' = 'saw a' \(str\)", warnings[0] + warnings[1])
    metrics = stages.reward_extra_metrics(batch)
    assert metrics["reward/extra/margin/mean"] == 0.5 and metrics["reward/extra/margin/non_finite_count"] == 2.0


def test_the_default_manager_keeps_the_zero_non_finite_flag_out_of_validation_records(make_batch, tokenizer):
    data = make_batch(["a", "b"], ["1", "2"], ["arith", "arith"])
    scores, extra = compute_reward(
        data, NaiveRewardManager(tokenizer, compute_score=lambda **kw: {"score": 1.0, "acc": 1.0})
    )
    records = process_validation_metrics(["arith"] * 2, ["u0", "u0"], {"reward": scores.sum(-1).tolist(), **extra})
    assert "val-core/arith/acc/mean@2" in records
    assert not [name for name in records if "reward_non_finite" in name]


def test_a_batched_function_may_return_a_numpy_array_but_not_a_single_number(make_batch, tokenizer):
    data = make_batch(["a", "bb"], ["1", "2"], ["t", "t"])
    vectorised = BatchRewardManager(tokenizer, compute_score=lambda solution_strs, **kw: np.array([1.0, 2.0]))
    assert vectorised(data).sum(-1).tolist() == [1.0, 2.0]
    with pytest.raises(RewardFunctionError, match=r"returned 1\.0 for 2 responses"):
        BatchRewardManager(tokenizer, compute_score=lambda **kw: 1.0)(data)


def test_the_batch_manager_wraps_a_raising_function_naming_it(make_batch, tokenizer):
    def broken(data_sources, solution_strs, ground_truths, extra_infos):
        raise KeyError("oops")

    with pytest.raises(RewardFunctionError, match=r"batched reward function .*broken, on 2 rows.*raised KeyError"):
        BatchRewardManager(tokenizer, compute_score=broken)(make_batch(["a", "b"], ["1", "2"], ["t", "t"]))


SOMETIMES_BROKEN = textwrap.dedent(
    """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str.startswith("bad"):
            raise RuntimeError("scorer bug")
        return {"score": 1.0, "acc": 0.5}
    """
)


def _prime(tokenizer, tmp_path, **settings) -> PrimeRewardManager:
    path = tmp_path / "scorer.py"
    path.write_text(SOMETIMES_BROKEN)
    return PrimeRewardManager(tokenizer, compute_score=load_custom_function(str(path)), num_processes=1, timeout=30,
                              start_method="fork", **settings)  # fmt: skip


def test_prime_failures_and_scorer_extras_reach_the_training_metrics(make_batch, tokenizer, tmp_path):
    manager = _prime(tokenizer, tmp_path)
    try:
        batch, _ = stages.attach_reward(make_batch(["ok", "bad", "ok"], ["1"] * 3, ["t"] * 3), manager)
    finally:
        manager.pool.close()
    metrics = stages.reward_extra_metrics(batch)
    assert metrics["reward/error_count"] == 1.0 and metrics["reward/crash_count"] == 0.0
    assert metrics["reward/timeout_count"] == 0.0 and metrics["reward/extra/acc/mean"] == 0.5


def test_a_scorer_failing_on_every_row_stops_the_run(make_batch, tokenizer, tmp_path):
    manager = _prime(tokenizer, tmp_path)
    try:
        with pytest.raises(RewardFunctionError, match=r"failed on 2 of 2 rows of a batch .*'error': 2"):
            manager(make_batch(["bad", "bad again"], ["1", "2"], ["t", "t"]))
    finally:
        manager.pool.close()


def test_the_stop_threshold_is_configurable(make_batch, tokenizer, tmp_path):
    manager = _prime(tokenizer, tmp_path, stop_at_failed_fraction=0.5)
    try:
        with pytest.raises(RewardFunctionError, match=r"failed on 1 of 2 rows"):
            manager(make_batch(["bad", "ok"], ["1", "2"], ["t", "t"]))
    finally:
        manager.pool.close()


def test_reward_metrics_count_flags_and_average_numeric_extras_only():
    metrics = reward_metrics(
        {"reward_crash": [1.0, 0.0, math.nan], "acc": [1.0, math.nan, 0.0], "pred": ["7", "", "1"]}
    )
    assert metrics == {
        "reward/error_count": 0.0,
        "reward/crash_count": 1.0,
        "reward/timeout_count": 0.0,
        "reward/non_finite_count": 0.0,
        "reward/extra/acc/mean": 0.5,
    }
