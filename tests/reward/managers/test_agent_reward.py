"""Rewards an `openai_agent` function returned (`agent_reward`) come before the scoring function; None rows are
scored on their final text as before."""

import math

import numpy as np
import pytest
import torch

from hyflow.reward.managers import get_reward_manager_cls
from hyflow.reward.managers.base import RewardFunctionError

RESPONSES = ["<answer>3</answer>", "<answer>4</answer>", "<answer>3</answer>"]
TRUTHS = ["3", "3", "3"]


def with_agent_rewards(data, rewards):
    data.non_tensor_batch["agent_reward"] = np.array(rewards, dtype=object)
    return data


def last_token_scores(data, reward):
    lengths = data.batch["attention_mask"][:, -reward.shape[1] :].sum(-1)
    return reward[torch.arange(len(data)), lengths - 1].tolist()


@pytest.mark.parametrize("name", ["naive", "batch", "prime", "dapo"])
def test_every_manager_takes_the_agents_reward_and_scores_the_rows_without_one(make_batch, tokenizer, name):
    data = with_agent_rewards(make_batch(RESPONSES, TRUTHS, ["arith"] * 3), [0.25, None, -1.0])
    result = get_reward_manager_cls(name)(tokenizer)(data, return_dict=True)
    scores = last_token_scores(data, result["reward_tensor"])
    assert scores[0] == 0.25 and scores[2] == -1.0  # the function's reward, though the text scores 1.0
    assert scores[1] == pytest.approx(0.1)  # None: the arith scorer on the final text (format only)
    assert result["reward_extra_info"]["reward_from_agent"] == [1.0, 0.0, 1.0]


def test_the_scoring_function_is_not_called_for_rows_with_an_agent_reward(make_batch, tokenizer, tmp_path):
    seen = tmp_path / "ground_truths.txt"  # the function runs in a child process: it reports through a file
    data = with_agent_rewards(make_batch(RESPONSES, TRUTHS, ["arith"] * 3), [1.0, None, 1.0])
    data.non_tensor_batch["reward_model"][0] = {"style": "rule"}  # no ground truth: not needed with an agent reward

    def score_all(data_sources, solution_strs, ground_truths, extra_infos):
        seen.write_text(",".join(ground_truths))
        return [5.0] * len(solution_strs)

    reward = get_reward_manager_cls("batch")(tokenizer, compute_score=score_all)(data)
    assert last_token_scores(data, reward) == [1.0, 5.0, 1.0] and seen.read_text() == "3"


def test_reward_model_scores_are_added_to_an_agent_reward(make_batch, tokenizer):
    data = with_agent_rewards(make_batch(RESPONSES, TRUTHS, ["arith"] * 3, styles=["model"] * 3), [0.5] * 3)
    data.batch["rm_scores"] = torch.zeros(3, 24)
    data.batch["rm_scores"][:, 0] = 2.0
    reward = get_reward_manager_cls("naive")(tokenizer)(data)
    assert reward.sum(-1).tolist() == [2.5, 2.5, 2.5]


def test_a_non_finite_agent_reward_stops_the_step_or_scores_zero_as_configured(make_batch, tokenizer):
    data = with_agent_rewards(make_batch(RESPONSES, TRUTHS, ["arith"] * 3), [math.nan, None, None])
    with pytest.raises(RewardFunctionError, match=r"row 0: the agent function's reward .* is the non-finite score nan"):
        get_reward_manager_cls("naive")(tokenizer)(data)
    reward = get_reward_manager_cls("naive")(tokenizer, on_non_finite="zero")(data)
    assert last_token_scores(data, reward)[0] == 0.0


def test_an_agent_reward_that_overflows_float32_names_the_row_and_the_value(make_batch, tokenizer):
    data = with_agent_rewards(make_batch(RESPONSES, TRUTHS, ["arith"] * 3), [None, 1e308, None])
    with pytest.raises(RewardFunctionError, match=r"row 1: the agent function's reward .* 1e\+308, which overflows"):
        get_reward_manager_cls("naive")(tokenizer)(data)


def test_a_batch_without_agent_rewards_has_no_reward_from_agent_extra(make_batch, tokenizer):
    data = make_batch(RESPONSES, TRUTHS, ["arith"] * 3)
    extra = get_reward_manager_cls("naive")(tokenizer)(data, return_dict=True)["reward_extra_info"]
    assert "reward_from_agent" not in extra
