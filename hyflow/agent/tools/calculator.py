"""`calculator`: evaluates an arithmetic expression safely (parsed with `ast`, never `eval`).

Allowed: numbers, `+ - * / // % **`, unary `+ -`, parentheses. Anything else (names, calls, attributes) is an
error message to the model, not an exception. Exponents and results are bounded so `9**9**9` cannot stall a worker.

    tools:
      - class_name: calculator          # or hyflow.agent.tools.calculator.CalculatorTool
        config: {timeout: 5}
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from hyflow.agent.tools.base import BaseTool, ToolConfig, ToolResponse

MAX_EXPONENT = 64
MAX_ABS_RESULT = 1e100
MAX_EXPRESSION_CHARS = 512

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its value is out of range."""


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as error:
            raise CalculatorError("division by zero") from error
        except OverflowError as error:
            raise CalculatorError("the result is too large") from error
        if isinstance(value, complex):
            raise CalculatorError("the result is not a real number")
        if abs(value) > MAX_ABS_RESULT:
            raise CalculatorError("the result is too large")
        return value
    raise CalculatorError(f"unsupported syntax {type(node).__name__}: use numbers, + - * / // % ** and parentheses")


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression; CalculatorError when it is not plain arithmetic."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise CalculatorError(f"invalid expression: {error.msg}") from error
    return _evaluate(tree)


def format_number(value: int | float) -> str:
    """Integers as integers (also 4.0 -> 4), other floats with up to 10 significant digits."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.10g}"


class CalculatorTool(BaseTool):
    """Arithmetic on demand; a bad expression comes back as an error message the model can read."""

    config_class = ToolConfig
    default_schema = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 12"}},
                "required": ["expression"],
            },
        },
    }

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        expression = str(parameters.get("expression", ""))
        try:
            text = format_number(calculate(expression))
            ok = True
        except CalculatorError as error:
            text, ok = f"Error: {error}", False
        return ToolResponse(text=text), 0.0, {"ok": ok}
