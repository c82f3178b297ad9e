"""The prime reward manager survives scorers that hang, kill their process or raise: those rows score 0."""

import textwrap

import pytest

from hyflow.reward.custom import load_custom_function
from hyflow.reward.managers.naive import NaiveRewardManager
from hyflow.reward.managers.prime import PrimeRewardManager

MISBEHAVING_SCORER = textwrap.dedent(
    """
    import os
    import time


    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str.startswith("hang"):
            time.sleep(3600)
        if solution_str.startswith("die"):
            os._exit(1)
        if solution_str.startswith("raise"):
            raise RuntimeError("scorer bug")
        return {"score": 1.0 if solution_str == ground_truth else 0.0, "length": len(solution_str)}
    """
)


@pytest.mark.timeout(120)
def test_prime_scores_hanging_dying_and_raising_rows_zero_and_counts_them(make_batch, tokenizer, tmp_path):
    path = tmp_path / "scorer.py"
    path.write_text(MISBEHAVING_SCORER)
    responses = ["1", "hang", "2", "die", "3", "raise", "4"]
    truths = ["1", "x", "2", "x", "3", "x", "5"]
    data = make_batch(responses, truths, ["t"] * len(responses))
    manager = PrimeRewardManager(tokenizer, compute_score=load_custom_function(str(path)), num_processes=2, timeout=4)
    try:
        result = manager(data, return_dict=True)
    finally:
        manager.pool.close()
    assert result["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    extra = result["reward_extra_info"]
    assert extra["reward_timeout"] == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert extra["reward_crash"] == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert extra["reward_error"] == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert extra["length"][0] == 1


@pytest.mark.timeout(120)
def test_prime_matches_naive_on_the_built_in_scorers(make_batch, tokenizer):
    responses = ["<answer>3</answer>", "#### 12", "<answer>4</answer>"]
    data = make_batch(responses, ["3", "12", "3"], ["arith", "gsm8k", "arith"])
    manager = PrimeRewardManager(tokenizer, num_processes=2, timeout=60)
    try:
        prime = manager(data)
    finally:
        manager.pool.close()
    assert prime.tolist() == NaiveRewardManager(tokenizer)(data).tolist()
