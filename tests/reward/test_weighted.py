"""Weighted reward combinations: format 0.2 / correctness 0.7 / length 0.1, and a custom component."""

import pytest

from hyflow.config.reward import RewardFunctionConfig
from hyflow.reward.weighted import build_weighted_score


def _entries(**weights):
    return [RewardFunctionConfig(name=name, weight=weight) for name, weight in weights.items()]


def test_the_seed_example_weighs_format_correctness_and_length():
    score = build_weighted_score(_entries(format=0.2, correctness=0.7, length=0.1))
    correct = score("arith", "<answer>46</answer>", "46")
    assert correct["format"] == 1.0 and correct["correctness"] == 1.0
    assert correct["length"] == pytest.approx(1 - 19 / 200)
    assert correct["score"] == pytest.approx(0.2 + 0.7 + 0.1 * (1 - 19 / 200))
    wrong = score("arith", "<answer>45</answer>", "46")
    assert wrong["correctness"] == 0.0 and wrong["score"] == pytest.approx(0.2 + 0.1 * (1 - 19 / 200))


def test_a_component_from_a_file_takes_its_reward_kwargs(tmp_path):
    path = tmp_path / "extra.py"
    path.write_text(
        "def polite(data_source, solution_str, ground_truth, extra_info=None, word='please'):\n"
        "    return float(word in solution_str)\n"
    )
    entries = [
        RewardFunctionConfig(name="correctness", weight=1.0),
        RewardFunctionConfig(name="polite", path=str(path), weight=0.5, reward_kwargs={"word": "thanks"}),
    ]
    score = build_weighted_score(entries)
    assert score("openai/gsm8k", "thanks #### 3", "3")["score"] == pytest.approx(1.5)


def test_an_unknown_built_in_component_lists_the_built_ins():
    with pytest.raises(ValueError, match=r"\['compute_score', 'correctness', 'format', 'length'\]"):
        build_weighted_score(_entries(brevity=1.0))
