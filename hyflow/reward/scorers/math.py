"""MATH scorer with verl's exact rules (the Hendrycks MATH string normalisation verl and lm-eval-harness use).

Registered for verl's MATH data sources (`lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval`,
`HuggingFaceH4/MATH-500`), so a run ported from verl trains on the same reward. The score is 1.0 when the last
`\\boxed{...}` (or `\\boxed x`) of the response, normalised by `strip_string`, equals the normalised ground truth
as a string, else 0.0. Like verl: `\\fbox{}` answers score 0, a normalisation step that cannot apply falls back
to comparing the raw strings, and "0.5" equals "\\frac{1}{2}" but "0.25" does not equal "\\frac14". For symbolic
equivalence use `math_verify` (see docs/howto/reward_function.md, which lists what differs).

    from hyflow.reward.scorers import math
    math.compute_score("so x = \\boxed{\\dfrac{1}{2}}", "\\frac12")   # -> 1.0
"""

from __future__ import annotations

from hyflow.reward.scorers import register_scorer

# a normalisation step that raises one of these makes verl compare the raw strings (or score 0 in compute_score)
_NOT_APPLICABLE = (ValueError, IndexError, AttributeError, TypeError)


def last_boxed_only_string(text: str) -> str | None:
    """The last `\\boxed{...}` with its braces (or `\\fbox{...}`), or `\\boxed x` up to the next `$`; else None."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if text[i] == "}" and depth == 0:
            return text[start : i + 1]
    return None


def remove_boxed(boxed: str) -> str:
    """The argument of `\\boxed x` or `\\boxed{x}`; a ValueError for anything else (such as `\\fbox{x}`)."""
    if "\\boxed " in boxed:
        if not boxed.startswith("\\boxed "):
            raise ValueError(f"not a '\\boxed ' answer: {boxed!r}")
        return boxed[len("\\boxed ") :]
    if not (boxed.startswith("\\boxed{") and boxed.endswith("}")):
        raise ValueError(f"not a '\\boxed{{}}' answer: {boxed!r}")
    return boxed[len("\\boxed{") : -1]


def _fix_sqrt(text: str) -> str:
    """`\\sqrt3` -> `\\sqrt{3}` (one character); an IndexError when `\\sqrt` ends the string."""
    head, *parts = text.split("\\sqrt")
    return head + "".join("\\sqrt" + (p if p[0] == "{" else "{" + p[0] + "}" + p[1:]) for p in parts)


def _fix_fracs(text: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`; unchanged when a `\\frac` has fewer than two
    characters after it; an IndexError when `\\frac` ends the string."""
    head, *parts = text.split("\\frac")
    out = head
    for part in parts:
        if part[0] == "{":
            out += "\\frac" + part
        elif len(part) < 2:
            return text
        elif part[1] != "{":
            out += "\\frac{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            out += "\\frac{" + part[0] + "}" + part[1:]
    return out


def _fix_a_slash_b(text: str) -> str:
    """`3/4` -> `\\frac{3}{4}` for two plain integers; anything else unchanged."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    return f"\\frac{{{a}}}{{{b}}}" if text == f"{a}/{b}" else text


def _remove_right_units(text: str) -> str:
    """Drop a trailing `\\text{ unit}`; a ValueError when `\\text{ ` appears more than once."""
    if "\\text{ " not in text:
        return text
    parts = text.split("\\text{ ")
    if len(parts) != 2:
        raise ValueError("more than one '\\text{ '")
    return parts[0]


def strip_string(text: str) -> str:
    """verl's normalisation, step by step: no newlines, `\\!`, `\\left`/`\\right`, degrees, `\\$`, right units,
    `\\%` or spaces; `\\\\` -> `\\`, `tfrac`/`dfrac` -> `frac`; a leading `0` on `.5`; `k = 5` -> `5` (a name of at
    most two characters); `\\sqrt3`, `\\frac12`, `3/4` and `0.5` written with braces / as `\\frac{1}{2}`."""
    for old, new in [("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac")]:
        text = text.replace(old, new)
    for token in ("\\left", "\\right", "^{\\circ}", "^\\circ", "\\$"):
        text = text.replace(token, "")
    text = _remove_right_units(text)
    text = text.replace("\\\\%", "").replace("\\%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    text = _fix_sqrt(text) if "\\sqrt" in text else text
    text = _fix_fracs(text.replace(" ", ""))
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _fix_a_slash_b(text)


def is_equiv(answer: str | None, ground_truth: str | None) -> bool:
    """Equal after `strip_string`; the raw strings are compared when normalising fails."""
    if answer is None or ground_truth is None:
        return answer is None and ground_truth is None
    try:
        return strip_string(answer) == strip_string(ground_truth)
    except _NOT_APPLICABLE:
        return answer == ground_truth


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the last boxed answer of `solution_str` is equivalent to `ground_truth` (used as given), else 0.0."""
    try:
        boxed = last_boxed_only_string(solution_str)
        return 1.0 if boxed is not None and is_equiv(remove_boxed(boxed), ground_truth) else 0.0
    except _NOT_APPLICABLE:
        return 0.0


@register_scorer("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
def score_math(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """Registry entry: verl's default for its MATH data sources."""
    return compute_score(solution_str, ground_truth)
