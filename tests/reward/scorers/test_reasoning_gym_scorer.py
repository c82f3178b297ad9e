"""The `reasoning_gym/<task>` scorer: reasoning-gym's answer tag and the task's own score_answer on stored rows."""

import pyarrow.parquet as pq
import pytest

from hyflow.data.prepare import prepare_task
from hyflow.reward.managers.base import RewardFunctionError
from hyflow.reward.managers.naive import NaiveRewardManager
from hyflow.reward.managers.prime import PrimeRewardManager
from hyflow.reward.scorers import default_compute_score, get_scorer
from hyflow.reward.scorers import reasoning_gym as rg_scorer


def stored_rows(tmp_path, task, size=2):
    """Rows of `task` as prepare-data wrote them and parquet gives them back."""
    written = prepare_task("reasoning_gym", tmp_path / task, tasks=task, train_size=size, test_size=1, seed=1)
    return pq.read_table(written["train"]).to_pylist()


def score(row, response):
    truth = row["reward_model"]["ground_truth"]
    return default_compute_score(row["data_source"], response, truth, row["extra_info"])


@pytest.mark.parametrize("task", ["basic_arithmetic", "word_sorting", "spell_backward"])
def test_the_stored_answer_in_an_answer_tag_scores_one_and_a_wrong_one_zero(tmp_path, task):
    for row in stored_rows(tmp_path, task):
        answer = row["reward_model"]["ground_truth"]
        assert score(row, f"Let me think.\n<answer>{answer}</answer>") == 1.0
        assert score(row, "<answer>certainly not it</answer>") == 0.0


def test_the_last_answer_tag_counts_and_a_response_without_one_scores_zero(tmp_path):
    row = stored_rows(tmp_path, "basic_arithmetic", size=1)[0]
    answer = row["reward_model"]["ground_truth"]
    assert score(row, f"<answer>wrong</answer> on second thought <answer> {answer} </answer>") == 1.0
    assert score(row, f"<answer>{answer}</answer> no, <answer>wrong</answer>") == 0.0
    assert score(row, f"The answer is {answer}.") == 0.0


def test_every_reasoning_gym_data_source_finds_the_one_scorer():
    assert get_scorer("reasoning_gym/chain_sum") is rg_scorer.compute_score
    assert get_scorer("reasoning_gym/word_ladder") is rg_scorer.compute_score


def test_a_data_source_naming_a_task_reasoning_gym_lacks_is_an_error_naming_close_matches():
    with pytest.raises(ValueError, match=r"task='chain_sun' is not a reasoning-gym task; did you mean \['chain_sum'"):
        default_compute_score("reasoning_gym/chain_sun", "<answer>1</answer>", "1", {})


def test_a_score_answer_that_raises_is_reraised_naming_the_task_and_the_answer(tmp_path):
    row = stored_rows(tmp_path, "word_sorting", size=1)[0]
    row["extra_info"]["entry"] = '{"question": "q", "answer": "a", "metadata": {}}'  # its sorted_words are lost

    with pytest.raises(RuntimeError, match=r"reasoning_gym/word_sorting: score_answer\(answer='a, b'.*KeyError"):
        score(row, "<answer>a, b</answer>")


@pytest.mark.timeout(60)
def test_the_naive_manager_stops_on_a_raising_score_answer_naming_the_row_and_the_task(make_batch, tokenizer):
    data = make_batch(["<answer>a, b</answer>"], ["a, b"], ["reasoning_gym/word_sorting"])  # no stored entry

    with pytest.raises(RewardFunctionError, match=r"row 0 \(data_source='reasoning_gym/word_sorting'.*score_answer"):
        NaiveRewardManager(tokenizer)(data)


@pytest.mark.timeout(60)
def test_the_prime_manager_scores_a_raising_score_answer_zero_and_flags_the_row(make_batch, tokenizer):
    responses = ["<answer>a, b</answer>", "<answer>olleh</answer>"]
    data = make_batch(responses, ["a, b", "olleh"], ["reasoning_gym/word_sorting", "reasoning_gym/spell_backward"])
    manager = PrimeRewardManager(tokenizer, num_processes=1, timeout=30, stop_at_failed_fraction=2.0)
    try:
        result = manager(data, return_dict=True)
    finally:
        manager.pool.close()

    assert result["reward_tensor"].sum(-1).tolist() == [0.0, 1.0]  # word_sorting's entry has no sorted_words
    assert result["reward_extra_info"]["reward_error"] == [1.0, 0.0]
