"""MATH boxed-answer extraction and equivalence on tricky strings."""

import pytest

from hyflow.reward.scorers import math_verify as math_scorer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{a}{\\sqrt{b^{2}}}} done", "\\frac{a}{\\sqrt{b^{2}}}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\fbox{7}", "7"),
        ("$\\boxed 5$", "5"),
        ("\\boxed{unclosed", None),
        ("no box at all", None),
    ],
)
def test_last_boxed_only_string_handles_nesting_fbox_and_missing_boxes(text, expected):
    assert math_scorer.last_boxed_only_string(text) == expected


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),
        ("\\boxed{x(x+2)}", "x^2+2x", 1.0),
        ("\\boxed{10\\%}", "10", 1.0),
        ("\\boxed{\\text{(B)}}", "B", 1.0),
        ("\\boxed{3}", "\\boxed{3}", 1.0),
        ("\\boxed{x^2}", "x^3", 0.0),
        ("the answer is 5", "5", 0.0),
    ],
)
def test_equivalent_forms_score_one_and_different_answers_zero(solution, truth, expected):
    assert math_scorer.compute_score(solution, truth) == expected


def test_normalised_string_fallback_ignores_spacing_units_and_dollar_signs():
    assert math_scorer.normalize_answer("\\$ 1,000 \\text{ dollars}") == "1,000"
    assert math_scorer.normalize_answer("\\left( .5, 2.0 \\right)") == "(0.5,2.0)"
    assert math_scorer.is_equiv("\\text{Monday}", "Monday")
