"""Scorer for `reasoning_gym/<task>` rows (`hyflow prepare-data reasoning_gym`): the task's own `score_answer`.

The answer is extracted the way reasoning-gym's own evaluation does (`reasoning_gym.utils.extract_answer`): the
content of the LAST `<answer>...</answer>` block, stripped; a response without one scores 0.0 (the score_answer of
every task gives 0.0 to None). Boxed values (`\\boxed{...}`) are not read: the rows' system prompt asks for the tag.
The entry is rebuilt from `extra_info["entry"]` (the JSON text prepare-data stored: question, answer, metadata) and
`score_answer(answer, entry)` of `reasoning_gym.create_dataset(task)` gives the score, a float in [0, 1] (some tasks
give partial credit). A row without a stored entry falls back to `{"answer": ground_truth, "metadata": {}}`.

A task name reasoning-gym lacks is a ValueError naming close matches. A `score_answer` that raises is re-raised with
the task and the answer named, so the reward manager's failure rules apply (naive: the step stops naming the row;
prime: the row scores 0 and is counted in `reward/error_count`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from hyflow.data.preprocess.reasoning_gym import DATA_SOURCE_PREFIX, check_task, import_reasoning_gym
from hyflow.reward.scorers import register_scorer_prefix


@functools.cache
def _score_fn(task: str) -> Any:
    """The task's `score_answer` (one dataset object per task, built once per process)."""
    check_task(task)
    return import_reasoning_gym().get_score_answer_fn(task)


def rebuild_entry(ground_truth: Any, extra_info: dict | None) -> dict[str, Any]:
    """The reasoning-gym entry stored by prepare-data (`extra_info["entry"]`, JSON text or a dict)."""
    stored = (extra_info or {}).get("entry")
    if stored is None:
        return {"answer": ground_truth, "metadata": {}}
    entry = json.loads(stored) if isinstance(stored, str) else dict(stored)
    entry.setdefault("metadata", {})
    return entry


def extract_answer(solution_str: str) -> str | None:
    """reasoning-gym's answer: the stripped content of the last `<answer>` block, or None."""
    from reasoning_gym.utils import extract_answer as rg_extract_answer

    return rg_extract_answer(solution_str)


@register_scorer_prefix(DATA_SOURCE_PREFIX)
def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """The task's `score_answer(extracted answer, stored entry)` as a float."""
    task = data_source[len(DATA_SOURCE_PREFIX) :]
    score_answer = _score_fn(task)
    answer = extract_answer(solution_str)
    entry = rebuild_entry(ground_truth, extra_info)
    try:
        return float(score_answer(answer, entry))
    except Exception as exc:
        raise RuntimeError(
            f"reasoning_gym/{task}: score_answer(answer={answer!r}, entry) raised {type(exc).__name__}: {exc}"
        ) from exc
