"""The naive and batch reward managers: scores on the last valid response token, extra info, errors."""

import math

import numpy as np
import pytest
import torch

from hyflow.reward.managers import get_reward_manager_cls
from hyflow.reward.managers.batch import BatchRewardManager
from hyflow.reward.managers.naive import NaiveRewardManager

RESPONSES = ["<answer>3</answer>", "<answer>4</answer>", "so #### 12", "\\boxed{\\frac{1}{2}}", "nothing"]
TRUTHS = ["3", "3", "12", "0.5", "7"]
SOURCES = ["arith", "arith", "openai/gsm8k", "lighteval/MATH", "arith"]


def test_naive_puts_each_score_on_the_last_valid_response_token(make_batch, tokenizer):
    data = make_batch(RESPONSES, TRUTHS, SOURCES)
    reward = NaiveRewardManager(tokenizer)(data)
    lengths = data.batch["attention_mask"][:, -24:].sum(-1)
    expected = torch.tensor([1.0, 0.1, 1.0, 1.0, 0.0])
    assert torch.equal(reward[torch.arange(5), lengths - 1], expected)
    assert reward.sum(-1).tolist() == pytest.approx(expected.tolist())
    assert reward.shape == (5, 24) and reward.dtype == torch.float32


def test_naive_and_batch_managers_give_the_same_tensor(make_batch, tokenizer):
    data = make_batch(RESPONSES, TRUTHS, SOURCES)
    naive = NaiveRewardManager(tokenizer)(data, return_dict=True)
    batch = BatchRewardManager(tokenizer)(data, return_dict=True)
    assert torch.equal(naive["reward_tensor"], batch["reward_tensor"])
    assert naive["reward_extra_info"].keys() == batch["reward_extra_info"].keys()


def test_dict_scores_become_extra_info_with_nan_for_rows_that_lack_a_key(make_batch, tokenizer):
    data = make_batch(RESPONSES, TRUTHS, SOURCES)
    extra = NaiveRewardManager(tokenizer)(data, return_dict=True)["reward_extra_info"]
    assert extra["acc"][:2] == [1.0, 0.0] and math.isnan(extra["acc"][2])
    assert np.nanmean(extra["format"]) == pytest.approx(2 / 3)


def test_a_batched_custom_function_is_called_once_with_lists(make_batch, tokenizer, tmp_path):
    calls = tmp_path / "calls.txt"  # the function runs in a child process: it reports its calls through a file

    def score_all(data_sources, solution_strs, ground_truths, extra_infos):
        with calls.open("a") as f:
            f.write(f"{len(solution_strs)}\n")
        return [float(len(s)) for s in solution_strs]

    data = make_batch(["ab", "abcd"], ["x", "y"], ["t", "t"])
    reward = BatchRewardManager(tokenizer, compute_score=score_all)(data)
    assert calls.read_text() == "2\n" and reward.sum(-1).tolist() == [2.0, 4.0]


def test_a_scorer_that_raises_is_reported_with_row_and_data_source(make_batch, tokenizer):
    def broken(data_source, solution_str, ground_truth, extra_info=None):
        raise KeyError("oops")

    data = make_batch(["a", "b"], ["1", "2"], ["arith", "arith"])
    with pytest.raises(ValueError, match=r"broken, row 0 \(data_source='arith'.*raised KeyError: 'oops'"):
        NaiveRewardManager(tokenizer, compute_score=broken)(data)


def test_model_style_rows_take_the_reward_model_score_and_rule_rows_add_it(make_batch, tokenizer):
    data = make_batch(["<answer>3</answer>", "whatever"], ["3", None], ["arith", "arith"], styles=["rule", "model"])
    rm_scores = torch.zeros(2, 24)
    lengths = data.batch["attention_mask"][:, -24:].sum(-1)
    rm_scores[0, lengths[0] - 1], rm_scores[1, lengths[1] - 1] = 0.5, -0.25
    data.batch["rm_scores"] = rm_scores
    reward = NaiveRewardManager(tokenizer)(data)
    assert reward.sum(-1).tolist() == [1.5, -0.25]


def test_model_style_rows_without_a_reward_model_are_a_clear_error(make_batch, tokenizer):
    data = make_batch(["x"], [None], ["arith"], styles=["model"])
    with pytest.raises(ValueError, match=r"reward_model\.enable=True"):
        NaiveRewardManager(tokenizer)(data)


def test_unknown_manager_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"\['batch', 'dapo', 'naive', 'prime'\]"):
        get_reward_manager_cls("fancy")
