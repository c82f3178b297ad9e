"""verl's exact scores: `openai/gsm8k` and verl's MATH data sources score like verl v0.9.0's own functions.

The expected values were obtained by running verl v0.9.0's `verl/utils/reward_score/gsm8k.py` and
`math_reward.py` on these inputs, out of tree; the cases themselves were written for this test.
"""

import pytest

from hyflow.reward.scorers import default_compute_score, gsm8k
from hyflow.reward.scorers import math as math_scorer

# (response, ground truth, verl's score)
VERL_GSM8K_STRICT = [
    ("She pays 1,200 dollars.\n#### 1,200", "1200", 1.0),
    ("#### 72", "72", 1.0),
    ("####72", "72", 0.0),
    ("#### 72.0", "72", 0.0),
    ("#### -5", "-5", 1.0),
    ("#### $5", "5", 0.0),
    ("the answer is 72", "72", 0.0),
    ("#### 10\n#### 12", "12", 1.0),
    ("#### 3.", "3", 0.0),
    ("x" * 400 + "#### 7", "7", 1.0),
    ("#### 7" + "y" * 400, "7", 0.0),
    ("#### 1,000,000", "1000000", 1.0),
    ("#### 12 apples", "12", 1.0),
    ("#### .", ".", 1.0),
    ("no digits here", "3", 0.0),
    ("####  8", "8", 0.0),
]
# flexible extraction with format_score=0.1
VERL_GSM8K_FLEXIBLE = [
    ("so 1,200 in total.", "1200", 0.1),
    ("so 1,200 in total.", "1,200", 1.0),
    ("5 apples and 7 pears.", "7", 1.0),
    ("answer: 3.", "3.", 1.0),
    ("... .", ".", 0.1),
    ("-4 degrees", "-4", 1.0),
    ("nothing", "1", 0.0),
    ("#### 72", "72", 1.0),
]
VERL_MATH = [
    ("so x = \\boxed{\\dfrac{1}{2}}", "\\frac12", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{0.25}", "\\frac14", 0.0),
    ("\\boxed{\\frac{1}{4}}", "\\frac14", 1.0),
    ("\\fbox{5}", "5", 0.0),
    ("\\boxed 5$ done", "5", 1.0),
    ("\\boxed{5} and then \\boxed{6}", "6", 1.0),
    ("\\boxed{x = 3}", "3", 1.0),
    ("\\boxed{abc = 3}", "3", 0.0),
    ("\\boxed{3/4}", "\\frac{3}{4}", 1.0),
    ("\\boxed{\\sqrt3}", "\\sqrt{3}", 1.0),
    ("\\boxed{10^\\circ}", "10", 1.0),
    ("\\boxed{50\\%}", "50", 1.0),
    ("\\boxed{\\$5}", "5", 1.0),
    ("\\boxed{.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),
    ("\\boxed{5 \\text{ cm} \\text{ m}}", "5", 0.0),
    ("\\boxed{\\left(1,2\\right)}", "(1,2)", 1.0),
    ("\\boxed{2}", "\\boxed{2}", 0.0),
    ("no box", "2", 0.0),
    ("\\boxed{\\frac}", "\\frac", 1.0),
    ("\\boxed{\\sqrt}", "\\sqrt", 1.0),
    ("\\boxed{\\frac1}", "\\frac1", 1.0),
    ("\\boxed{1/2/3}", "1/2/3", 1.0),
    ("\\boxed{\\tfrac{3}{5}}", "\\frac35", 1.0),
    ("\\boxed{{5}", "5", 0.0),
    ("\\boxed{x^2+2x}", "x(x+2)", 0.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{1,000}", "1000", 0.0),
]


@pytest.mark.parametrize(("solution", "truth", "expected"), VERL_GSM8K_STRICT)
def test_openai_gsm8k_scores_exactly_like_verl(solution, truth, expected):
    assert default_compute_score("openai/gsm8k", solution, truth) == expected
    assert gsm8k.compute_score(solution, truth, method="strict") == expected


@pytest.mark.parametrize(("solution", "truth", "expected"), VERL_GSM8K_FLEXIBLE)
def test_flexible_gsm8k_extraction_scores_exactly_like_verl(solution, truth, expected):
    assert gsm8k.compute_score(solution, truth, method="flexible", format_score=0.1) == expected


@pytest.mark.parametrize(
    "data_source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]
)
def test_verls_math_data_sources_score_exactly_like_verl(data_source):
    scores = [default_compute_score(data_source, solution, truth) for solution, truth, _ in VERL_MATH]

    assert scores == [expected for _, _, expected in VERL_MATH]


def test_the_math_normalisation_rewrites_short_fractions_and_drops_units():
    assert math_scorer.strip_string("\\dfrac12 \\text{ cm}") == "\\frac{1}{2}"
    assert math_scorer.remove_boxed(math_scorer.last_boxed_only_string("a \\boxed{\\frac{1}{2}} b")) == "\\frac{1}{2}"


def test_the_forgiving_scorers_stay_available_by_name():
    assert default_compute_score("openai/gsm8k", "####72", "72") == 0.0
    assert default_compute_score("gsm8k_lenient", "####72", "72") == 1.0
    assert default_compute_score("lighteval/MATH", "\\boxed{x^2+2x}", "x(x+2)") == 0.0
    assert default_compute_score("math_verify", "\\boxed{x^2+2x}", "x(x+2)") == 1.0
