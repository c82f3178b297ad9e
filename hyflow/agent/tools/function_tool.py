"""A plain Python function as a tool: its OpenAI schema is generated from the signature and the docstring.

    from hyflow.agent.tools import function_tool

    @function_tool
    def add(a: int, b: int = 0) -> int:
        '''Add two integers.

        Args:
            a: the first number.
            b: the second number.
        '''
        return a + b

`add` is now a `BaseTool` subclass (the call `add(2, 3)` no longer runs the function; `add.function` does), usable
in a tool YAML as `class_name: my_package.tools.add`. Its schema: name `add`, the docstring's first paragraph as
the description, one property per parameter with the JSON type of its annotation (`str`, `int`, `float`, `bool`,
`list[...]`, `dict`, `Literal[...]` as an enum, `X | None`) and the `Args:` line as its description; parameters
without a default are required. The function may be `async`; a sync one runs in a thread. Its return value becomes
the tool's text (`str()`; a `ToolResponse` passes through); an exception becomes an error message to the model
(the agent loop's usual handling).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

from hyflow.agent.tools.base import BaseTool, ToolResponse

__all__ = ["function_schema", "function_tool"]

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}


def _property(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON-schema property of one parameter annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return {"type": _JSON_TYPES.get(type(args[0]), "string"), "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        if len(kept) == 1:
            return _property(kept[0], where)
        return {"anyOf": [_property(arg, where) for arg in kept]}
    if origin in (list, tuple, set) or annotation in (list, tuple, set):
        items = _property(args[0], where) if args and args[0] is not Ellipsis else {}
        return {"type": "array", **({"items": items} if items else {})}
    if origin is dict or annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[dict if origin is dict else annotation]}
    raise ValueError(
        f"{where}: annotation {annotation!r} has no JSON-schema type; use str, int, float, bool, list[...], dict, "
        f"Literal[...] or X | None, or write the schema yourself (a BaseTool subclass with default_schema)."
    )


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(the first paragraph, {parameter: description} from a Google-style `Args:` section)."""
    doc = inspect.cleandoc(doc or "")
    description = doc.split("\n\n", 1)[0].strip().replace("\n", " ")
    arguments: dict[str, str] = {}
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.MULTILINE)
    if section:
        current = None
        for line in section.group(1).splitlines():
            match = re.match(r"^\s+(\w+)\s*(?:\([^)]*\))?:\s*(.*)$", line)
            if match:
                current = match.group(1)
                arguments[current] = match.group(2).strip()
            elif current and line.strip():
                arguments[current] += " " + line.strip()
    return description, arguments


def function_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI function-tool schema of `fn`, from its annotations and docstring."""
    where = f"function tool {fn.__name__}"
    description, documented = _docstring_parts(fn.__doc__ or "")
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for name, parameter in inspect.signature(fn).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name not in hints:
            raise ValueError(f"{where}: parameter {name!r} has no type annotation; annotate it (e.g. `{name}: str`).")
        properties[name] = _property(hints[name], where)
        if name in documented:
            properties[name]["description"] = documented[name]
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": fn.__name__, "description": description, "parameters": parameters}}


def function_tool(fn: Callable[..., Any]) -> type[BaseTool]:
    """Decorator: a `BaseTool` subclass that calls `fn` with the model's arguments (see the module docstring)."""
    schema = function_schema(fn)

    async def execute(
        self: BaseTool, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        if inspect.iscoroutinefunction(fn):
            result = await fn(**parameters)
        else:
            result = await asyncio.to_thread(fn, **parameters)
        response = result if isinstance(result, ToolResponse) else ToolResponse(text=str(result))
        return response, 0.0, {}

    tool_class = type(
        fn.__name__,
        (BaseTool,),
        {
            "default_schema": schema,
            "execute": execute,
            "function": staticmethod(fn),
            "__doc__": fn.__doc__,
            "__module__": fn.__module__,
            "__qualname__": fn.__qualname__,
        },
    )
    return tool_class
