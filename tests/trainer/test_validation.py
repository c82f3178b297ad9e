"""Validation metrics: bootstrap reductions against naive loops, key naming and per-source averaging."""

from collections import Counter

import numpy as np
import pytest

from hyflow.trainer.validation import (
    bootstrap_best_worst,
    bootstrap_majority,
    process_validation_metrics,
    select_generations_to_log,
)


def _naive_draws(n: int, k: int, n_bootstrap: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(n_bootstrap, k))


def test_bootstrap_best_and_worst_match_a_naive_loop_over_the_same_draws():
    values = np.array([0.0, 1.0, 0.5, 0.25, 1.0])
    got = bootstrap_best_worst(values, 3, n_bootstrap=50, rng=np.random.default_rng(7))
    draws = _naive_draws(5, 3, 50, seed=7)
    best = [max(values[i] for i in row) for row in draws]
    worst = [min(values[i] for i in row) for row in draws]
    assert got["best@3/mean"] == pytest.approx(np.mean(best))
    assert got["best@3/std"] == pytest.approx(np.std(best))
    assert got["worst@3/mean"] == pytest.approx(np.mean(worst))


def test_bootstrap_majority_matches_a_naive_vote_with_first_seen_tie_break():
    values = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.5])
    predictions = ["7", "3", "4", "7", "3", {"not": "hashable"}]
    got = bootstrap_majority(values, predictions, 4, n_bootstrap=60, rng=np.random.default_rng(3))
    voted = []
    for row in _naive_draws(6, 4, 60, seed=3):
        drawn = [repr(predictions[i]) if isinstance(predictions[i], dict) else predictions[i] for i in row]
        winner = Counter(drawn).most_common(1)[0][0]
        voted.append(values[row[drawn.index(winner)]])
    assert got["maj@4/mean"] == pytest.approx(np.mean(voted))
    assert got["maj@4/std"] == pytest.approx(np.std(voted))


def _two_sources() -> tuple[list[str], list[str], dict[str, list]]:
    sources = ["gsm8k"] * 8 + ["math"] * 4
    uids = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    rewards = [1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1]
    preds = ["2", "5", "5", "2", "9", "8", "9", "9", "x", "x", "x", "x"]
    return sources, uids, {"reward": [float(r) for r in rewards], "pred": preds}


def test_validation_metrics_are_named_per_source_with_core_and_aux_sections():
    sources, uids, infos = _two_sources()
    metrics = process_validation_metrics(sources, uids, infos, seed=1, n_bootstrap=200)
    assert metrics["val-core/gsm8k/reward/mean@4"] == pytest.approx(0.25)  # prompt a: 0.5, prompt b: 0.0
    assert metrics["val-core/math/reward/mean@4"] == 1.0
    assert metrics["val-core/math/reward/best@4/mean"] == 1.0
    assert metrics["val-core/math/reward/maj@4/mean"] == 1.0
    assert "val-aux/gsm8k/reward/best@2/mean" in metrics
    assert "val-aux/gsm8k/reward/std@4" in metrics
    assert "val-aux/gsm8k/reward/worst@4/mean" in metrics
    assert not any("/pred/" in key for key in metrics)


def test_best_is_at_least_mean_and_mean_at_least_worst():
    sources, uids, infos = _two_sources()
    metrics = process_validation_metrics(sources, uids, infos, seed=1, n_bootstrap=200)
    best = metrics["val-core/gsm8k/reward/best@4/mean"]
    worst = metrics["val-aux/gsm8k/reward/worst@4/mean"]
    assert best >= metrics["val-core/gsm8k/reward/mean@4"] >= worst


def test_validation_metrics_are_identical_across_runs_with_the_same_seed():
    sources, uids, infos = _two_sources()
    first = process_validation_metrics(sources, uids, infos, seed=5, n_bootstrap=100)
    second = process_validation_metrics(sources, uids, infos, seed=5, n_bootstrap=100)
    assert first == second


def test_accuracy_is_the_core_variable_when_recorded_and_strings_are_skipped():
    sources, uids, infos = _two_sources()
    infos["acc"] = [r > 0 for r in infos["reward"]]
    infos["note"] = ["text"] * len(uids)
    metrics = process_validation_metrics(sources, uids, infos, seed=1, n_bootstrap=50)
    assert "val-core/gsm8k/acc/mean@4" in metrics
    assert "val-aux/gsm8k/reward/mean@4" in metrics
    assert not any("/note/" in key for key in metrics)


def test_single_sample_prompts_report_only_mean_at_one():
    metrics = process_validation_metrics(["s", "s"], ["a", "b"], {"reward": [1.0, 0.0]})
    assert metrics == {"val-core/s/reward/mean@1": 0.5}


def test_info_with_the_wrong_number_of_values_is_rejected_with_its_name():
    with pytest.raises(ValueError, match="'acc' has 1 values for 2 samples"):
        process_validation_metrics(["s", "s"], ["a", "b"], {"reward": [1.0, 0.0], "acc": [1.0]})


def test_logged_generations_are_the_same_whatever_order_they_arrive_in():
    inputs, outputs, scores = ["q3", "q1", "q2", "q4"], ["o3", "o1", "o2", "o4"], [0.3, 0.1, 0.2, 0.4]
    first = select_generations_to_log(inputs, outputs, scores, num=2, seed=0)
    second = select_generations_to_log(inputs[::-1], outputs[::-1], scores[::-1], num=2, seed=0)
    assert first == second
    assert len(first) == 2
    assert all(inp.replace("q", "o") == out for inp, out, _ in first)


def test_a_variable_one_data_source_does_not_report_is_left_out_of_that_sources_metrics():
    nan = float("nan")
    metrics = process_validation_metrics(
        data_sources=["gsm8k", "gsm8k", "arith", "arith"],
        uids=["a", "a", "b", "b"],
        infos={"reward": [1.0, 0.0, 1.0, 1.0], "acc": [nan, nan, 1.0, 0.0]},
        n_bootstrap=10,
    )
    assert metrics["val-core/gsm8k/reward/mean@2"] == 0.5
    assert not any(key.startswith(("val-core/gsm8k/acc", "val-aux/gsm8k/acc")) for key in metrics)
    assert metrics["val-core/arith/acc/mean@2"] == 0.5
