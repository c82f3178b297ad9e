"""function_tool: a typed, documented Python function becomes a tool with a generated OpenAI schema."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from hyflow.agent.tools import BaseTool, ToolResponse, function_schema, function_tool, tools_from_entries


@function_tool
def convert(amount: float, unit: Literal["km", "mi"], digits: int | None = None, tags: list[str] | None = None) -> str:
    """Convert a distance to metres.

    Args:
        amount: how far, in `unit`.
        unit: the unit of `amount`.
        digits: round the result to this many digits
            (no rounding when left out).
        tags: ignored labels.
    """
    metres = amount * (1000.0 if unit == "km" else 1609.344)
    return f"{round(metres, digits) if digits is not None else metres} m"


@function_tool
async def shout(text: str) -> str:
    """Upper-case a text."""
    await asyncio.sleep(0)
    return text.upper()


def test_the_schema_comes_from_the_annotations_defaults_and_the_docstring():
    function = convert.default_schema["function"]
    assert function["name"] == "convert"
    assert function["description"] == "Convert a distance to metres."
    assert function["parameters"] == {
        "type": "object",
        "properties": {
            "amount": {"type": "number", "description": "how far, in `unit`."},
            "unit": {"type": "string", "enum": ["km", "mi"], "description": "the unit of `amount`."},
            "digits": {
                "type": "integer",
                "description": "round the result to this many digits (no rounding when left out).",
            },
            "tags": {"type": "array", "items": {"type": "string"}, "description": "ignored labels."},
        },
        "required": ["amount", "unit"],
    }


def test_a_function_tool_runs_the_function_with_the_models_arguments():
    tool = convert()
    assert isinstance(tool, BaseTool) and tool.name == "convert"
    response, reward, _ = asyncio.run(tool.execute("i", {"amount": 2, "unit": "km", "digits": 0}))
    assert response == ToolResponse(text="2000.0 m") and reward == 0.0
    assert asyncio.run(shout().execute("i", {"text": "hi"}))[0].text == "HI"
    assert convert.function(1, "km") == "1000.0 m"


def test_a_function_tool_loads_from_a_tool_config_entry_by_import_path():
    (tool,) = tools_from_entries([{"class_name": f"{__name__}.convert", "config": {"timeout": 5}}])
    assert tool.name == "convert" and tool.config.timeout == 5


def test_a_parameter_without_annotation_or_json_type_is_named_in_the_error():
    def untyped(x):
        """No types."""

    def odd(x: complex):
        """A complex number."""

    with pytest.raises(ValueError, match="parameter 'x' has no type annotation"):
        function_schema(untyped)
    with pytest.raises(ValueError, match="has no JSON-schema type"):
        function_schema(odd)
