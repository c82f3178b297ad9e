"""A forgiving GSM8K scorer (`gsm8k_lenient`): hyflow's own parsing, kinder to the model than verl's.

Registered as data source `gsm8k_lenient`; `openai/gsm8k` gets verl's exact scorer (`scorers/gsm8k.py`). What
differs from verl: `####` may be followed by any spacing, `$` and `-$` signs are read, numbers compare by value
("72.0" equals "72", "1,200" equals "1200" in flexible mode too), and a flexible match never ends on a bare ".".

Only the last 300 characters of a response are searched, so a long response cannot win by listing many numbers
early. Commas and `$` are removed before comparing; numbers compare by value ("72.0" equals "72").

    from hyflow.reward.scorers import gsm8k_lenient
    gsm8k_lenient.compute_score("... so she pays $1,200.\n####1,200", "1200")   # -> 1.0
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Literal

from hyflow.reward.scorers import register_scorer

SOLUTION_CLIP_CHARS = 300
_NUMBER = r"-?\$?-?[0-9][0-9,]*(?:\.[0-9]+)?|-?\.[0-9]+"
_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_FLEXIBLE = re.compile(_NUMBER)


def _clean(number: str) -> str:
    return number.replace(",", "").replace("$", "").strip()


def extract_solution(solution_str: str, method: Literal["strict", "flexible"] = "strict") -> str | None:
    """The answer string found in the last 300 characters, commas and `$` removed; None if there is none.

    strict: the number after the last `####`; flexible: the last number anywhere.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k: method={method!r} is not supported; use 'strict' or 'flexible'.")
    tail = solution_str[-SOLUTION_CLIP_CHARS:]
    matches = (_STRICT if method == "strict" else _FLEXIBLE).findall(tail)
    return _clean(matches[-1]) if matches else None


def _numbers_equal(answer: str, ground_truth: str) -> bool:
    try:
        return Decimal(answer) == Decimal(ground_truth)
    except InvalidOperation:
        return answer == ground_truth


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: Literal["strict", "flexible"] = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` if the extracted answer equals the ground truth, `format_score` if an answer was found but is
    wrong, 0.0 if no answer was found."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if _numbers_equal(answer, _clean(str(ground_truth))) else format_score


@register_scorer("gsm8k_lenient")
def score_gsm8k_lenient(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> float:
    """Registry entry: strict extraction, 1.0 correct, 0.0 otherwise."""
    return compute_score(solution_str, ground_truth)
