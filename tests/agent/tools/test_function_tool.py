"""function_tool: a typed, documented Python function becomes a registered, stateless tool with a generated schema."""

from __future__ import annotations

import asyncio
import logging
from typing import Literal

import pytest

from hyflow.agent.tools import BaseTool, ToolResponse
from hyflow.agent.tools.function_tool import (
    FUNCTION_TOOL_REGISTRY,
    FunctionTool,
    function_tool,
    get_function_tool,
    load_function_tools_from_path,
    normalize_function_tool_return,
)
from hyflow.agent.tools.schemas import OpenAIFunctionToolSchema


def schema_of(name: str) -> dict:
    return FUNCTION_TOOL_REGISTRY[name].tool_schema.model_dump(exclude_unset=True, exclude_none=True)["function"]


def test_the_schema_comes_from_the_hints_defaults_and_the_docstring():
    @function_tool
    def convert(amount: int | float, unit: Literal["km", "mi"], digits: int | None = None, tags: list[str] = ()):
        """Convert a distance to metres.

        Args:
            amount: how far, in `unit`.
            unit: the unit of `amount`.
            digits: round the result to this many digits
                (no rounding when left out).
            tags: ignored labels.
        """

    function = schema_of("convert")
    assert function["description"] == "Convert a distance to metres."
    assert function["parameters"] == {
        "type": "object",
        "properties": {
            "amount": {"type": ["integer", "number"], "description": "how far, in `unit`."},
            "unit": {"type": "string", "enum": ["km", "mi"], "description": "the unit of `amount`."},
            "digits": {
                "type": "integer",
                "nullable": True,
                "description": "round the result to this many digits (no rounding when left out).",
            },
            "tags": {"type": "array", "items": {"type": "string"}, "description": "ignored labels."},
        },
        "required": ["amount", "unit"],
    }


def test_the_decorator_registers_under_the_function_name_or_the_given_one_and_returns_the_function():
    def double(x: int) -> int:
        """Double a number.

        Args:
            x: the number.
        """
        return 2 * x

    assert function_tool(double) is double and function_tool("twice")(double) is double
    assert FUNCTION_TOOL_REGISTRY["double"].fn is double and schema_of("twice")["name"] == "twice"
    assert get_function_tool("twice").name == "twice"
    with pytest.raises(KeyError, match="'thrice' is not registered"):
        get_function_tool("thrice")


def test_an_explicit_schema_replaces_the_inferred_one():
    given = {"type": "function", "function": {"name": "raw", "description": "given", "parameters": {}}}
    given["function"]["parameters"] = {"type": "object", "properties": {}, "required": []}
    model = OpenAIFunctionToolSchema.model_validate(given)

    @function_tool("raw", schema=given)
    def raw() -> str:
        return ""

    @function_tool("typed", schema=model)
    def typed() -> str:
        return ""

    assert schema_of("raw")["description"] == "given" and FUNCTION_TOOL_REGISTRY["typed"].tool_schema is model


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x: str):\n    return x", "no docstring"),
        ("def f(x):\n    '''Doc.\n\n    Args:\n        x: a thing.\n    '''", "missing a type hint"),
        ("def f(x: int, y: int):\n    '''Add.\n\n    Args:\n        x: x.\n    '''", "no description for the argument"),
        ("def f(x: int, *rest: int):\n    '''Sum.\n\n    Args:\n        x: x.\n    '''", "variadic parameter"),
    ],
)
def test_a_function_the_schema_cannot_describe_is_refused_when_it_is_decorated(source, message):
    namespace: dict = {}
    exec(source, namespace)
    with pytest.raises(Exception, match=message):
        function_tool(namespace["f"])


def test_a_second_function_under_a_taken_name_is_refused():
    @function_tool("echo")
    def first(text: str) -> str:
        """Echo.

        Args:
            text: the text.
        """
        return text

    function_tool("echo")(first)  # the same function again is fine
    with pytest.raises(ValueError, match="'echo' is already registered"):

        @function_tool("echo")
        def second(text: str) -> str:
            """Echo.

            Args:
                text: the text.
            """
            return text


def test_a_function_tool_is_a_stateless_tool_that_runs_sync_and_async_functions():
    @function_tool
    def shout(text: str) -> str:
        """Upper-case a text.

        Args:
            text: the text.
        """
        return text.upper()

    @function_tool
    async def whisper(text: str) -> tuple[str, float, dict]:
        """Lower-case a text, with a reward.

        Args:
            text: the text.
        """
        return text.lower(), 0.5, {"chars": len(text)}

    sync, coroutine = FUNCTION_TOOL_REGISTRY["shout"], FUNCTION_TOOL_REGISTRY["whisper"]
    assert isinstance(sync, FunctionTool) and not isinstance(sync, BaseTool)
    assert (sync.is_async, coroutine.is_async) == (False, True)
    assert asyncio.run(sync.call({"text": "hi"})) == "HI"

    async def episode():
        instance, _ = await coroutine.create()
        result = await coroutine.execute(instance, {"text": "HeY"})
        return result, await coroutine.calc_reward(instance), await coroutine.release(instance)

    assert asyncio.run(episode()) == ((ToolResponse(text="hey"), 0.5, {"chars": 3}), 0.0, None)
    assert coroutine.missing_arguments({}) == ["text"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("hello", (ToolResponse(text="hello"), 0.0, {})),
        ({"a": 1, "b": "zwei"}, (ToolResponse(text='{"a": 1, "b": "zwei"}'), 0.0, {})),
        (("text", 1.5), (ToolResponse(text="text"), 1.5, {})),
        (("text", 2, {"k": "v"}), (ToolResponse(text="text"), 2.0, {"k": "v"})),
        (("text", None, None), (ToolResponse(text="text"), 0.0, {})),
        ((ToolResponse(text="t"), False), (ToolResponse(text="t"), 0.0, {})),
        (42, (ToolResponse(text="42"), 0.0, {})),
    ],
)
def test_a_function_tools_return_value_becomes_response_reward_and_metrics(value, expected):
    response, reward, metrics = normalize_function_tool_return(value)
    assert (response, reward, metrics) == expected and isinstance(reward, float)


def test_a_returned_tool_response_passes_through_and_a_tuple_of_bad_length_is_an_error():
    response = ToolResponse(text="x")
    assert normalize_function_tool_return(response)[0] is response
    for bad in [(), ("a", 1, {}, "extra")]:
        with pytest.raises(TypeError, match="length 1, 2, or 3"):
            normalize_function_tool_return(bad)


TOOL_FILE = '''
from hyflow.agent.tools.function_tool import function_tool


@function_tool("{name}")
def {name}(x: str) -> str:
    """Return x.

    Args:
        x: the text.
    """
    return x
'''


def test_a_file_of_function_tools_runs_once_and_returns_only_the_tools_it_registered(tmp_path, monkeypatch):
    @function_tool
    def elsewhere(x: str) -> str:
        """Defined outside the file.

        Args:
            x: x.
        """
        return x

    (tmp_path / "tools.py").write_text(TOOL_FILE.format(name="beta") + TOOL_FILE.format(name="alpha"))
    monkeypatch.chdir(tmp_path)
    first = load_function_tools_from_path("tools.py")
    assert [tool.name for tool in first] == ["alpha", "beta"]
    assert load_function_tools_from_path(tmp_path / "tools.py") is first  # not run again: no duplicate names
    assert FUNCTION_TOOL_REGISTRY["alpha"] is first[0] and "elsewhere" in FUNCTION_TOOL_REGISTRY


def test_a_file_without_function_tools_is_reported(tmp_path, caplog):
    (tmp_path / "empty.py").write_text("x = 1\n")
    with caplog.at_level(logging.WARNING):
        assert load_function_tools_from_path(tmp_path / "empty.py") == []
    assert "no @function_tool decorators found" in caplog.text


def test_a_file_that_fails_to_run_runs_again_once_fixed(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('not yet')\n")
    with pytest.raises(RuntimeError, match="not yet"):
        load_function_tools_from_path(path)
    path.write_text(TOOL_FILE.format(name="fixed"))
    assert [tool.name for tool in load_function_tools_from_path(path)] == ["fixed"]
