"""Scorer for the synthetic visual `shapes` task: the answer block must equal the ground truth exactly.

The ground truth is the answer string (`"3"` for a count, `"red"` for a colour); the comparison ignores case and
surrounding spaces. Like the other synthetic tasks, the reward is 1.0 when correct, 0.1 when only well formed.
"""

from __future__ import annotations

from hyflow.reward.scorers import register_scorer
from hyflow.reward.scorers.answer_tags import combine, extract_answer, format_reward


def correctness_reward(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last answer block equals `ground_truth` (case and outer spaces ignored), else 0.0."""
    answer = extract_answer(solution_str)
    return 1.0 if answer is not None and answer.lower() == str(ground_truth).strip().lower() else 0.0


def compute_score(
    solution_str: str, ground_truth: str, format_score: float = 0.1, score: float = 1.0
) -> dict[str, float]:
    """Combined reward plus its `acc` and `format` parts (see `answer_tags.combine`)."""
    return combine(correctness_reward(solution_str, ground_truth), format_reward(solution_str), format_score, score)


@register_scorer("hyflow/shapes", "shapes")
def score_shapes(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict:
    """Registry entry for the `shapes` data source."""
    return compute_score(solution_str, ground_truth)
