"""Scorer for the synthetic `arith` task: is the number in `<answer>...</answer>` the exact result?

    from hyflow.reward.scorers import arith
    arith.compute_score("12 + 34 = 46 <answer>46</answer>", "46")   # -> {"score": 1.0, "acc": 1.0, "format": 1.0}

Format (one well-formed answer block) and correctness are reported separately; the combined score is `score`
when correct, `format_score` when only well formed, 0 otherwise.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from hyflow.reward.scorers import register_scorer
from hyflow.reward.scorers.answer_tags import combine, extract_answer, format_reward


def _as_number(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", "").replace(" ", ""))
    except InvalidOperation:
        return None


def correctness_reward(solution_str: str, ground_truth: str | int) -> float:
    """1.0 when the answer block holds a number equal to the ground truth, else 0.0."""
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    value, truth = _as_number(answer), _as_number(str(ground_truth))
    return 1.0 if value is not None and truth is not None and value == truth else 0.0


def compute_score(
    solution_str: str, ground_truth: str | int, format_score: float = 0.1, score: float = 1.0
) -> dict[str, float]:
    """Combined reward plus its `acc` and `format` parts (see `answer_tags.combine`)."""
    return combine(correctness_reward(solution_str, ground_truth), format_reward(solution_str), format_score, score)


@register_scorer("arith", "hyflow/arith")
def score_arith(
    data_source: str, solution_str: str, ground_truth: str | int, extra_info: dict | None = None
) -> dict[str, float]:
    """Registry entry for the `arith` data source."""
    return compute_score(solution_str, ground_truth)
