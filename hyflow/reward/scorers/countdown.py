"""Scorer for the synthetic `countdown` task: an equation that uses each given number once and hits the target.

The ground truth is `{"target": 22, "numbers": [3, 5, 7]}` (a JSON string of that dict also works). The answer
block must hold an arithmetic expression over `+ - * /` and parentheses, e.g. `<answer>3 * 5 + 7</answer>`;
a trailing `= 22` is allowed. The expression is evaluated by walking its syntax tree, never with `eval`.
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Mapping
from typing import Any

from hyflow.reward.scorers import register_scorer
from hyflow.reward.scorers.answer_tags import combine, extract_answer, format_reward

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_MAX_EXPRESSION_CHARS = 200


def _evaluate(node: ast.AST, numbers_used: list[int]) -> float:
    """Value of an expression tree made only of integers, + - * / and parentheses; ValueError for anything else."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, numbers_used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        numbers_used.append(node.value)
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left, numbers_used), _evaluate(node.right, numbers_used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def evaluate_equation(expression: str) -> tuple[float, list[int]] | None:
    """(value, integers used) of an equation such as `3 * 5 + 7` or `3 * 5 + 7 = 22`; None if it is not valid."""
    left = expression.split("=")[0].strip()
    if not left or len(left) > _MAX_EXPRESSION_CHARS:
        return None
    numbers_used: list[int] = []
    try:
        value = _evaluate(ast.parse(left, mode="eval"), numbers_used)
    except (SyntaxError, ValueError, OverflowError):
        return None
    return value, numbers_used


def parse_ground_truth(ground_truth: Mapping[str, Any] | str) -> tuple[int, list[int]]:
    """(target, numbers) from a dict or its JSON string; numpy arrays from parquet are accepted as lists."""
    if isinstance(ground_truth, str):
        ground_truth = json.loads(ground_truth)
    return int(ground_truth["target"]), [int(n) for n in ground_truth["numbers"]]


def correctness_reward(solution_str: str, ground_truth: Mapping[str, Any] | str) -> float:
    """1.0 when the answer uses every given number exactly once and equals the target, else 0.0."""
    answer = extract_answer(solution_str)
    result = evaluate_equation(answer) if answer is not None else None
    if result is None:
        return 0.0
    target, numbers = parse_ground_truth(ground_truth)
    value, used = result
    return 1.0 if sorted(used) == sorted(numbers) and abs(value - target) < 1e-6 else 0.0


def compute_score(
    solution_str: str, ground_truth: Mapping[str, Any] | str, format_score: float = 0.1, score: float = 1.0
) -> dict[str, float]:
    """Combined reward plus its `acc` and `format` parts (see `answer_tags.combine`)."""
    return combine(correctness_reward(solution_str, ground_truth), format_reward(solution_str), format_score, score)


@register_scorer("countdown", "hyflow/countdown")
def score_countdown(
    data_source: str, solution_str: str, ground_truth: Mapping[str, Any] | str, extra_info: dict | None = None
) -> dict[str, float]:
    """Registry entry for the `countdown` data source."""
    return compute_score(solution_str, ground_truth)
