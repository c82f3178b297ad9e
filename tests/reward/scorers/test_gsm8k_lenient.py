"""gsm8k_lenient: hyflow's forgiving GSM8K extraction and scoring on tricky strings."""

import pytest

from hyflow.reward.scorers import gsm8k_lenient as gsm8k

STRICT_CASES = [
    ("She pays 5 + 7 = 12 dollars.\n#### 12", "12", 1.0),
    ("#### 1,234", "1234", 1.0),
    ("#### $1,234", "1234", 1.0),
    ("#### -5", "-5", 1.0),
    ("#### 3.50", "3.5", 1.0),
    ("#### 72.", "72", 1.0),
    ("#### 10 then I changed my mind #### 12", "12", 1.0),
    ("#### 12 then I changed my mind #### 10", "12", 0.0),
    ("the answer is 12", "12", 0.0),
    ("####12", "12", 1.0),
    ("#### 13", "12", 0.0),
]


@pytest.mark.parametrize(("solution", "truth", "expected"), STRICT_CASES)
def test_strict_method_scores_the_last_hash_answer(solution, truth, expected):
    assert gsm8k.compute_score(solution, truth, method="strict") == expected


def test_flexible_method_takes_the_last_number_anywhere():
    assert gsm8k.compute_score("so 3 + 4 is 7, the answer is 1,234.", "1234", method="flexible") == 1.0
    assert gsm8k.compute_score("so 3 + 4 is 7, the answer is 1,234.", "7", method="flexible") == 0.0


def test_answer_outside_the_last_300_characters_is_not_found():
    solution = "#### 42 " + "blah " * 80
    assert len(solution) > gsm8k.SOLUTION_CLIP_CHARS
    assert gsm8k.extract_solution(solution) is None
    assert gsm8k.compute_score(solution, "42") == 0.0


def test_format_score_is_given_for_a_well_formed_wrong_answer_only():
    assert gsm8k.compute_score("#### 41", "42", format_score=0.1) == 0.1
    assert gsm8k.compute_score("no answer here", "42", format_score=0.1) == 0.0
    assert gsm8k.compute_score("#### 42", "42", score=2.0) == 2.0


def test_unknown_method_is_a_value_error_listing_the_choices():
    with pytest.raises(ValueError, match=r"strict.*flexible"):
        gsm8k.extract_solution("#### 1", method="loose")
