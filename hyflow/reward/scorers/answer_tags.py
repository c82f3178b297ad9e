"""The `<answer>...</answer>` format shared by the synthetic tasks, and its format reward.

A response is well formed when it holds exactly one `<answer>...</answer>` block with something inside; the
answer is that block's stripped content. Keeping format and correctness apart lets a reward weigh them separately
(see the `weighted` reward manager).
"""

from __future__ import annotations

import re

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_ANSWER_BLOCK = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.DOTALL)


def extract_answer(solution_str: str) -> str | None:
    """The stripped content of the last `<answer>...</answer>` block, or None if there is none (or it is empty)."""
    blocks = _ANSWER_BLOCK.findall(solution_str)
    if not blocks:
        return None
    answer = blocks[-1].strip()
    return answer or None


def format_reward(solution_str: str) -> float:
    """1.0 when the response has exactly one non-empty answer block and no stray tags, else 0.0."""
    well_formed = (
        solution_str.count(ANSWER_OPEN) == 1
        and solution_str.count(ANSWER_CLOSE) == 1
        and extract_answer(solution_str) is not None
    )
    return 1.0 if well_formed else 0.0


def combine(correct: float, well_formed: float, format_score: float, score: float) -> dict[str, float]:
    """The synthetic tasks' reward: `score` when correct, `format_score` when only well formed, else 0.

    Returned as a dict so `acc` and `format` become separate metrics next to the combined `score`.
    """
    value = score if correct else (format_score if well_formed else 0.0)
    return {"score": value, "acc": float(correct), "format": float(well_formed)}
