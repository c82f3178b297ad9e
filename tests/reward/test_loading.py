"""load_reward_manager / compute_reward: from the config to token_level_scores."""

import textwrap

import pytest

from hyflow.config import PPOTrainerConfig
from hyflow.config.reward import REWARD_CALL_TIMEOUT_S, RewardFunctionConfig
from hyflow.reward import compute_reward, load_reward_manager
from hyflow.reward.managers import get_reward_manager_cls
from hyflow.reward.managers.batch import BatchRewardManager
from hyflow.reward.managers.dapo import DAPORewardManager


def test_the_default_config_scores_with_the_built_in_scorers(make_batch, tokenizer):
    manager = load_reward_manager(PPOTrainerConfig(), tokenizer)
    scores, extra = compute_reward(make_batch(["<answer>3</answer>"], ["3"], ["arith"]), manager)
    assert scores.sum().item() == 1.0 and extra["acc"] == [1.0]


def test_a_custom_function_from_the_config_is_used_by_the_batch_manager(make_batch, tokenizer, tmp_path):
    path = tmp_path / "r.py"
    path.write_text(
        textwrap.dedent("""
        def score(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0):
            return [scale * len(s) for s in solution_strs]
    """)
    )
    config = PPOTrainerConfig()
    config.reward_model.reward_manager = "batch"
    config.custom_reward_function.path, config.custom_reward_function.name = str(path), "score"
    config.custom_reward_function.reward_kwargs = {"scale": 2.0}
    manager = load_reward_manager(config, tokenizer)
    assert isinstance(manager, BatchRewardManager)
    scores, _ = compute_reward(make_batch(["abc"], ["x"], ["t"]), manager)
    assert scores.sum().item() == 6.0


def test_weighted_reward_functions_work_with_the_batch_manager(make_batch, tokenizer):
    config = PPOTrainerConfig()
    config.reward_model.reward_manager = "batch"
    config.reward_model.reward_functions = [RewardFunctionConfig("format", weight=0.3)]
    manager = load_reward_manager(config, tokenizer)
    scores, extra = compute_reward(make_batch(["<answer>9</answer>"], ["3"], ["arith"]), manager)
    assert scores.sum().item() == pytest.approx(0.3) and extra["format"] == [1.0]


def test_dapo_settings_come_from_the_config(tokenizer):
    config = PPOTrainerConfig()
    config.reward_model.reward_manager = "dapo"
    config.reward_model.overlong_buffer.enable, config.reward_model.overlong_buffer.len = True, 64
    manager = load_reward_manager(config, tokenizer)
    assert isinstance(manager, DAPORewardManager)
    assert manager.max_response_length == config.data.max_response_length and manager.overlong_buffer_len == 64


def test_reward_functions_and_a_custom_function_together_are_refused(tokenizer, tmp_path):
    config = PPOTrainerConfig()
    config.reward_model.reward_functions = [RewardFunctionConfig("format")]
    config.custom_reward_function.path = str(tmp_path / "r.py")
    with pytest.raises(ValueError, match="use one"):
        load_reward_manager(config, tokenizer)


@pytest.mark.parametrize("manager_name", ["naive", "batch", "prime", "dapo"])
def test_every_manager_takes_the_failure_settings_from_the_config(tokenizer, manager_name):
    config = PPOTrainerConfig()
    config.reward_model.reward_manager = manager_name
    config.reward_model.on_non_finite, config.reward_model.timeout_s = "zero", 7.0
    config.reward_model.stop_at_failed_fraction = 0.25
    manager = load_reward_manager(config, tokenizer)
    assert (manager.on_non_finite, manager.timeout_s, manager.stop_at_failed_fraction) == ("zero", 7.0, 0.25)


@pytest.mark.parametrize("manager_name", ["naive", "batch", "dapo"])
def test_the_default_config_bounds_every_call_of_the_reward_function(tokenizer, manager_name):
    config = PPOTrainerConfig()
    config.reward_model.reward_manager = manager_name
    manager = load_reward_manager(config, tokenizer)
    assert manager.isolated.timeout_s == REWARD_CALL_TIMEOUT_S and 0 < REWARD_CALL_TIMEOUT_S < float("inf")
    assert get_reward_manager_cls(manager_name)(tokenizer).isolated.timeout_s == REWARD_CALL_TIMEOUT_S
