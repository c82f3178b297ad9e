"""Scorers of the synthetic tasks: `arith` and `countdown`, format separable from correctness."""

import json

import numpy as np
import pytest

from hyflow.reward.scorers import arith, countdown
from hyflow.reward.scorers.answer_tags import extract_answer, format_reward


@pytest.mark.parametrize(
    ("solution", "well_formed"),
    [
        ("<answer>46</answer>", 1.0),
        ("thinking... <answer> 46 </answer>", 1.0),
        ("<answer></answer>", 0.0),
        ("<answer>46", 0.0),
        ("<answer>1</answer><answer>2</answer>", 0.0),
        ("46", 0.0),
    ],
)
def test_format_reward_wants_exactly_one_non_empty_answer_block(solution, well_formed):
    assert format_reward(solution) == well_formed


def test_extract_answer_takes_the_last_block_stripped():
    assert extract_answer("<answer>1</answer> <answer> 2 </answer>") == "2"


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("<answer>46</answer>", "46", {"score": 1.0, "acc": 1.0, "format": 1.0}),
        ("<answer>-7</answer>", "-7", {"score": 1.0, "acc": 1.0, "format": 1.0}),
        ("<answer>1,234</answer>", 1234, {"score": 1.0, "acc": 1.0, "format": 1.0}),
        ("<answer>45</answer>", "46", {"score": 0.1, "acc": 0.0, "format": 1.0}),
        ("<answer>forty six</answer>", "46", {"score": 0.1, "acc": 0.0, "format": 1.0}),
        ("46", "46", {"score": 0.0, "acc": 0.0, "format": 0.0}),
    ],
)
def test_arith_reports_combined_score_accuracy_and_format(solution, truth, expected):
    assert arith.compute_score(solution, truth) == expected


GROUND_TRUTH = {"target": 22, "numbers": [3, 5, 7]}


@pytest.mark.parametrize(
    ("answer", "correct"),
    [
        ("3 * 5 + 7", 1.0),
        ("(7 + 5 * 3)", 1.0),
        ("3 * 5 + 7 = 22", 1.0),
        ("3 * 5 + 7 + 0", 0.0),  # uses a number that was not given
        ("5 * 5 - 3", 0.0),  # uses 5 twice and not 7
        ("3 * 5", 0.0),  # misses 7
        ("3 * 5 + 8", 0.0),
        ("__import__('os')", 0.0),
        ("3 ** 5 + 7", 0.0),
        ("7 / (5 - 5) + 3", 0.0),
    ],
)
def test_countdown_needs_each_number_once_and_the_target(answer, correct):
    assert countdown.correctness_reward(f"<answer>{answer}</answer>", GROUND_TRUTH) == correct


def test_countdown_accepts_a_json_ground_truth_and_numpy_number_lists():
    solution = "<answer>3 * 5 + 7</answer>"
    assert countdown.compute_score(solution, json.dumps(GROUND_TRUTH))["score"] == 1.0
    parquet_like = {"target": np.int64(22), "numbers": np.array([3, 5, 7])}
    assert countdown.compute_score(solution, parquet_like)["acc"] == 1.0


def test_countdown_gives_format_score_to_a_well_formed_wrong_equation():
    assert countdown.compute_score("<answer>3 + 5 + 7</answer>", GROUND_TRUTH) == {
        "score": 0.1,
        "acc": 0.0,
        "format": 1.0,
    }
