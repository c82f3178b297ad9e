"""The calculator tool: arithmetic through `ast`, errors as text, bounded sizes."""

from __future__ import annotations

import asyncio

import pytest

from hyflow.agent.tools.calculator import CalculatorError, CalculatorTool, calculate, format_number


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-2 ** 2", -4),
        ("10 % 4", 2),
        ("1.5e3", 1500.0),
    ],
)
def test_calculate_evaluates_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('ls')", "unsupported syntax Call"),
        ("x + 1", "unsupported syntax Name"),
        ("(1).real", "unsupported syntax Attribute"),
        ("'a' * 3", "unsupported syntax Constant"),
        ("1 / 0", "division by zero"),
        ("9 ** 9 ** 9", "exponent 387420489 is too large"),
        ("10 ** 60 * 10 ** 60", "too large"),
        ("2 +", "invalid expression"),
        ("1" * 600, "longer than 512 characters"),
    ],
)
def test_calculate_rejects_anything_but_bounded_arithmetic(expression, message):
    with pytest.raises(CalculatorError, match=message):
        calculate(expression)


def test_format_number_prints_whole_floats_as_integers():
    assert [format_number(v) for v in (4.0, 3.5, 7, 1 / 3)] == ["4", "3.5", "7", "0.3333333333"]


def test_the_tool_answers_with_the_value_or_an_error_message():
    tool = CalculatorTool()
    assert tool.name == "calculator"
    response, reward, metrics = asyncio.run(tool.execute("i", {"expression": "6 * 7"}))
    assert (response.text, reward, metrics) == ("42", 0.0, {"ok": True})
    response, _, metrics = asyncio.run(tool.execute("i", {"expression": "6 *"}))
    assert response.text.startswith("Error: invalid expression") and metrics == {"ok": False}
