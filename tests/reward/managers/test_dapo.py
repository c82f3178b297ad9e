"""The DAPO manager's soft overlong penalty: zero before the buffer, linear inside it, -penalty_factor at the end."""

import pytest

from hyflow.reward.managers.dapo import DAPORewardManager, overlong_penalty


@pytest.mark.parametrize(
    ("length", "expected"),
    [(10, 0.0), (12, 0.0), (14, -0.5), (16, -1.0)],
)
def test_overlong_penalty_is_linear_inside_the_buffer(length, expected):
    assert overlong_penalty(length, max_response_length=16, buffer_len=4, penalty_factor=1.0) == pytest.approx(expected)


def test_dapo_adds_the_penalty_to_the_score_and_reports_it(make_batch, tokenizer):
    short, long = "<answer>3</answer>", "<answer>3</answer>" + " pad" * 10
    data = make_batch([short, long], ["3", "3"], ["arith", "arith"], response_len=16)
    lengths = data.batch["attention_mask"][:, -16:].sum(-1).tolist()
    assert lengths[0] <= 8 and lengths[1] == 16
    buffer = {"enable": True, "len": 8, "penalty_factor": 0.5}
    manager = DAPORewardManager(tokenizer, max_resp_len=16, overlong_buffer_cfg=buffer)  # verl's keywords
    result = manager(data, return_dict=True)
    assert result["reward_tensor"].sum(-1).tolist() == pytest.approx([1.0, 0.5])
    assert result["reward_extra_info"]["overlong"] == [0.0, 1.0]
    assert result["reward_extra_info"]["overlong_reward"] == pytest.approx([0.0, -0.5])


def test_an_enabled_buffer_longer_than_the_response_limit_is_a_config_error(tokenizer):
    with pytest.raises(ValueError, match=r"overlong_buffer\.len=32"):
        DAPORewardManager(tokenizer, max_resp_len=16, overlong_buffer_cfg={"enable": True, "len": 32})
