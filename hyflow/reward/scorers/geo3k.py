"""Scorer for Geometry3K (`hiyouga/geometry3k`), as verl scores it: 0.9 · accuracy + 0.1 · format.

Format is 1 when the response is `<think>...</think>` followed by a `\\boxed{...}` answer; accuracy is 1 when the
last boxed answer is equivalent to the ground truth (`hyflow.reward.scorers.math_verify.is_equiv`).
"""

from __future__ import annotations

import re

from hyflow.reward.scorers import register_scorer
from hyflow.reward.scorers.math_verify import is_equiv, last_boxed_only_string

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(solution_str: str) -> float:
    """1.0 when the response reasons inside <think></think> and then gives a boxed answer."""
    return 1.0 if _FORMAT.fullmatch(solution_str.strip()) else 0.0


def accuracy_reward(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer is equivalent to `ground_truth`."""
    answer = last_boxed_only_string(solution_str)
    return 1.0 if answer is not None and is_equiv(answer, str(ground_truth)) else 0.0


def compute_score(solution_str: str, ground_truth: str, format_score: float = 0.1) -> dict[str, float]:
    """(1 − format_score) · accuracy + format_score · format, with both parts as metrics."""
    acc, well_formed = accuracy_reward(solution_str, ground_truth), format_reward(solution_str)
    return {"score": (1.0 - format_score) * acc + format_score * well_formed, "acc": acc, "format": well_formed}


@register_scorer("hiyouga/geometry3k", "geo3k")
def score_geo3k(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict:
    """Registry entry for the Geometry3K data source."""
    return compute_score(solution_str, ground_truth)
