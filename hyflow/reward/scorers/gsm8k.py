"""GSM8K scorer with verl's exact rules, so a run ported from verl trains on the same reward (`openai/gsm8k`).

Only the last 300 characters of a response are searched. The answer is a run of digits, `.`, `,` with an optional
leading `-`:

- strict (the default, as in verl): the last such run right after `#### ` (four `#`, one space); commas removed;
- flexible: the last such run anywhere that is not `""` or `.`; commas kept.

The answer must equal the ground truth as a string ("72.0" is not "72"). A found but wrong answer scores
`format_score`, no answer 0. hyflow's more forgiving parsing is `gsm8k_lenient` (see docs/howto/reward_function.md).

    from hyflow.reward.scorers import gsm8k
    gsm8k.compute_score("... so she pays 1,200 dollars.\n#### 1,200", "1200")   # -> 1.0
"""

from __future__ import annotations

import re
from typing import Literal

from hyflow.reward.scorers import register_scorer

SOLUTION_CLIP_CHARS = 300
_RUN = r"-?[0-9.,]+"
_STRICT = re.compile("#### (" + _RUN + ")")
_FLEXIBLE = re.compile(_RUN)


def extract_solution(solution_str: str, method: Literal["strict", "flexible"] = "strict") -> str | None:
    """The answer string of the last 300 characters (see the module docstring), or None when there is none."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k: method={method!r} is not supported; use 'strict' or 'flexible'.")
    tail = solution_str[-SOLUTION_CLIP_CHARS:]
    if method == "strict":
        matches = _STRICT.findall(tail)
        return matches[-1].replace(",", "") if matches else None
    matches = _FLEXIBLE.findall(tail)
    real = [m for m in matches if m not in ("", ".")]
    if real:
        return real[-1]
    return matches[0] if matches else None  # only dots: verl keeps the first of them


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: Literal["strict", "flexible"] = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` if the extracted answer equals `ground_truth`, `format_score` if it differs, 0 if none is found."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if answer == ground_truth else format_score


@register_scorer("openai/gsm8k", "gsm8k")
def score_gsm8k(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """Registry entry: verl's default for GSM8K (strict, 1.0 correct, 0.0 otherwise)."""
    return compute_score(solution_str, ground_truth)
