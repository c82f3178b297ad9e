"""The scorer registry: data sources map to scorers without a central if/elif."""

import pytest

from hyflow.reward.scorers import default_compute_score, get_scorer, register_scorer, registered_data_sources


def test_built_in_data_sources_are_registered_by_their_files():
    known = registered_data_sources()
    for name in ("openai/gsm8k", "lighteval/MATH", "arith", "countdown"):
        assert name in known


def test_default_compute_score_dispatches_on_the_data_source():
    assert default_compute_score("openai/gsm8k", "#### 12", "12") == 1.0
    assert default_compute_score("lighteval/MATH", "\\boxed{12}", "12") == 1.0
    assert default_compute_score("arith", "<answer>12</answer>", "12")["score"] == 1.0


def test_unknown_data_source_is_a_value_error_listing_known_ones():
    with pytest.raises(ValueError, match="openai/gsm8k"):
        get_scorer("no/such-task")


def test_registering_a_new_data_source_makes_it_scorable():
    @register_scorer("tests/always-half")
    def half(data_source, solution_str, ground_truth, extra_info=None):
        return 0.5

    assert default_compute_score("tests/always-half", "anything", None) == 0.5


def test_registering_a_taken_data_source_twice_is_an_error():
    assert "openai/gsm8k" in registered_data_sources()
    with pytest.raises(ValueError, match="already has scorer"):
        register_scorer("openai/gsm8k")(lambda data_source, solution_str, ground_truth, extra_info=None: 0.0)
