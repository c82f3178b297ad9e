import numpy as np
import pytest
import torch

from hyflow.protocol import DataProto
from hyflow.trainer.multi_trajectory import compute_advantage_for_multi_trajectories, final_rows_of_sessions
from hyflow.trainer.ppo_ops import compute_advantage


def _batch(scores: list[float], response_mask: list[list[int]]) -> DataProto:
    mask = torch.tensor(response_mask)
    rewards = torch.zeros(mask.shape)
    rewards[:, -1] = torch.tensor(scores)
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(["p"] * len(scores), dtype=object)},
    )


def test_final_rows_are_the_highest_index_of_each_session_even_with_underscores_in_the_uid():
    keys = ["a_b_0_0", "a_b_0_2", "a_b_0_1", "a_b_1_0"]
    assert final_rows_of_sessions(keys) == ([1, 3], [0, 0, 0, 1])


def test_every_row_of_a_session_gets_the_grpo_advantage_of_its_final_row():
    data = _batch([9.0, 1.0, 7.0, 0.0], [[1, 1, 0], [1, 1, 1], [0, 1, 1], [1, 0, 1]])
    keys = ["p_0_0", "p_0_1", "p_1_0", "p_2_0"]  # session 0 has two outputs: its final one scored 1.0
    result = compute_advantage_for_multi_trajectories(data.select_idxs([0, 1, 2, 3]), keys, adv_estimator="grpo")

    finals = compute_advantage(data.select_idxs([1, 2, 3]), adv_estimator="grpo")
    per_session = finals.batch["advantages"].sum(-1) / finals.batch["response_mask"].sum(-1)
    expected = per_session[[0, 0, 1, 2]].unsqueeze(-1) * data.batch["response_mask"]
    torch.testing.assert_close(result.batch["advantages"], expected)
    torch.testing.assert_close(result.batch["returns"], expected)


def test_one_output_per_session_is_plain_grpo():
    data = _batch([1.0, 0.0, 0.5], [[1, 1], [1, 0], [1, 1]])
    result = compute_advantage_for_multi_trajectories(data.select_idxs([0, 1, 2]), ["p_0_0", "p_1_0", "p_2_0"], "grpo")
    expected = compute_advantage(data, adv_estimator="grpo")
    torch.testing.assert_close(result.batch["advantages"], expected.batch["advantages"])


def test_estimators_without_sessions_score_every_row_as_it_is():
    data = _batch([1.0, 0.0, 0.5], [[1, 1], [1, 0], [1, 1]])
    result = compute_advantage_for_multi_trajectories(data.select_idxs([0, 1, 2]), ["x"] * 3, "rloo")
    expected = compute_advantage(data, adv_estimator="rloo")
    torch.testing.assert_close(result.batch["advantages"], expected.batch["advantages"])


def test_a_malformed_key_names_the_row_and_the_expected_form():
    data = _batch([1.0, 0.0], [[1], [1]])
    with pytest.raises(ValueError, match=r"batch_keys\[1\]='p_x'.*uid.*session_id.*index"):
        compute_advantage_for_multi_trajectories(data, ["p_0_0", "p_x"], "grpo")
