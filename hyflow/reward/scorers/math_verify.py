"""A symbolic MATH scorer (`math_verify`): the last `\\boxed{...}` (or `\\fbox{...}`) against the ground truth.

Registered as data source `math_verify` (and hyflow's `math`, `hendrycks_math`); verl's MATH data sources
(`lighteval/MATH`, ...) get verl's exact string normalisation (`scorers/math.py`), which this scorer accepts more
than: equal values in other forms, `\\fbox`, and a ground truth still wrapped in `\\boxed{}`.

Equivalence goes through `math-verify` (symbolic: `\\frac{1}{2}` equals `0.5`, `x(x+2)` equals `x^2+2x`) with a
time limit, and falls back to equality of normalised strings (spaces, `\\left`/`\\right`, `dfrac`, units and
`$` removed) when math-verify cannot parse either side.

The time limit is math-verify's own SIGALRM timer, which only works in a process's main thread; elsewhere
(threaded callers) the check runs without it, so use the `prime` reward manager, whose per-sample timeout kills
a worker process that hangs.

    from hyflow.reward.scorers import math_verify
    math_verify.compute_score("so the answer is \\boxed{\\frac{1}{2}}", "0.5")   # -> 1.0
"""

from __future__ import annotations

import logging
import re
import threading

from hyflow.reward.scorers import register_scorer

logger = logging.getLogger(__name__)

_BOX_COMMANDS = ("\\boxed", "\\fbox")
VERIFY_TIMEOUT_S = 5


def _matching_brace(text: str, open_index: int) -> int | None:
    """Index of the `}` that closes the `{` at `open_index`, or None when the braces never close."""
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def last_boxed_only_string(text: str) -> str | None:
    """The content of the last `\\boxed{...}` / `\\fbox{...}` (nested braces kept), or of `\\boxed 5`; else None."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest_start = start + len(command)
    if text.startswith(" ", rest_start):  # `\boxed 5`: the argument is the next word
        words = text[rest_start:].split("$")[0].split()
        return words[0] if words else None
    brace = text.find("{", rest_start)
    if brace != rest_start:
        return None
    close = _matching_brace(text, brace)
    return None if close is None else text[brace + 1 : close]


_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\$", "$", "^\\circ", "^{\\circ}", "\\%", "%")
_UNITS = re.compile(r"\\(?:text|mbox|mathrm)\{\s*(?:units?|degrees?|cm|m|inches|feet|dollars?)\s*\}")


def normalize_answer(answer: str) -> str:
    """A canonical string form for fallback comparison: `\\dfrac`→`\\frac`, no spaces, units, `$`, `%` or
    `\\left`/`\\right`, `\\text{x}`→`x`, leading `0` on decimals, a trailing `.0`/`.` dropped."""
    text = _UNITS.sub("", answer.strip())
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for token in _REMOVE:
        text = text.replace(token, "")
    text = re.sub(r"\\text\{(.*?)\}", r"\1", text)
    text = re.sub(r"\s+", "", text)
    text = re.sub(r"(?<![0-9])\.([0-9])", r"0.\1", text)
    text = re.sub(r"^([0-9]+)\.0*$", r"\1", text)
    return text.rstrip(".")


def _math_verify_equal(answer: str, ground_truth: str) -> bool | None:
    """True/False from math-verify, or None when it could not parse one side (or is not installed)."""
    try:
        from math_verify import parse, verify
    except ImportError:  # the fallback below still scores; math-verify is a declared dependency
        return None
    timeout = VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse("\\boxed{" + ground_truth + "}", parsing_timeout=timeout)
    pred = parse("\\boxed{" + answer + "}", parsing_timeout=timeout)
    if not gold or not pred:
        return None
    return bool(verify(gold, pred, timeout_seconds=timeout))


def is_equiv(answer: str, ground_truth: str) -> bool:
    """Whether two answer strings mean the same thing (math-verify first, normalised strings as fallback)."""
    if normalize_answer(answer) == normalize_answer(ground_truth):
        return True
    return bool(_math_verify_equal(answer, ground_truth))


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the last boxed answer of `solution_str` is equivalent to `ground_truth`, else 0.0."""
    answer = last_boxed_only_string(solution_str)
    if answer is None:
        return 0.0
    truth = last_boxed_only_string(ground_truth) if "\\boxed" in ground_truth else ground_truth
    return 1.0 if is_equiv(answer, str(truth)) else 0.0


@register_scorer("math_verify", "math", "hendrycks_math")
def score_math_verify(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """Registry entry: math-verify equivalence with the normalised-string fallback."""
    return compute_score(solution_str, ground_truth)
