"""Load tools from a YAML file (`actor_rollout_ref.rollout.multi_turn.tool_config_path`), checked at start-up.

    tools:
      - class_name: calculator                                   # a built-in name ...
        config: {timeout: 5}
      - class_name: my_package.tools.WeatherTool                 # ... or an import path to a BaseTool subclass
        config: {api_url: "http://127.0.0.1:9000"}
        tool_schema: {type: function, function: {name: weather, description: ..., parameters: {...}}}

`tool_schema` may be left out for tools that define a `default_schema` (all built-ins do).

`load_all_tools(tool_config_path, function_tool_path)` adds the `@function_tool` functions of a Python file
(`FunctionTool` records, hyflow.agent.tools.function_tool) to the YAML's tools, as verl's loader of the same name
does; a name both declare is an error naming both files.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import yaml

from hyflow.agent.tools.base import BaseTool
from hyflow.agent.tools.function_tool import FunctionTool, load_function_tools_from_path

Tool = BaseTool | FunctionTool  # what the agent loop calls: a stateful tool class, or a stateless function

BUILTIN_TOOLS: dict[str, str] = {
    "calculator": "hyflow.agent.tools.calculator.CalculatorTool",
    "python": "hyflow.agent.tools.python_executor.PythonTool",
    "search": "hyflow.agent.tools.search.SearchTool",
    "image_zoom": "hyflow.agent.tools.image_zoom.ImageZoomTool",
}
_ENTRY_KEYS = ("class_name", "config", "tool_schema")


def import_class(class_name: str, base: type, kind: str, builtins: dict[str, str]) -> type:
    """The class named by a built-in short name or a `package.module.Class` path, checked to subclass `base`."""
    path = builtins.get(class_name, class_name)
    module_name, _, attr = path.rpartition(".")
    fix = f"use a built-in name {sorted(builtins)} or an import path like 'my_package.module.MyClass'"
    if not module_name:
        raise ValueError(f"{kind} class_name={class_name!r} is neither a built-in nor an import path; {fix}.")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{kind} class_name={class_name!r} cannot be imported ({error}); {fix}.") from error
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{kind} class_name={class_name!r} is not a subclass of {base.__name__}; {fix}.")
    return cls


def read_yaml_list(path: str | os.PathLike, section: str, config_key: str) -> list[dict[str, Any]]:
    """The list under `section:` of a YAML file, with a clear error when the file or its shape is wrong."""
    if not os.path.isfile(path):
        raise ValueError(f"{config_key}={os.fspath(path)!r} does not exist; point it at a YAML file.")
    with open(path) as f:
        document = yaml.safe_load(f) or {}
    entries = document.get(section) if isinstance(document, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{config_key}={os.fspath(path)!r} must hold a list of mappings under '{section}:'.")
    return entries


def tools_from_entries(entries: list[dict[str, Any]], where: str = "tool config") -> list[BaseTool]:
    """Instantiate tools from `{class_name, config, tool_schema}` mappings; names must be unique."""
    tools: list[BaseTool] = []
    for i, entry in enumerate(entries):
        unknown = sorted(set(entry) - set(_ENTRY_KEYS))
        if unknown or "class_name" not in entry:
            raise ValueError(
                f"{where}: tools[{i}] has keys {sorted(entry)}; it needs 'class_name' and may have "
                f"{list(_ENTRY_KEYS[1:])} (unknown: {unknown})."
            )
        cls = import_class(str(entry["class_name"]), BaseTool, f"{where}: tools[{i}]", BUILTIN_TOOLS)
        tools.append(cls(config=entry.get("config") or {}, tool_schema=entry.get("tool_schema")))
    names = [tool.name for tool in tools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"{where}: tool names {duplicates} appear more than once; give each tool a unique name.")
    return tools


def initialize_tools_from_config(path: str | os.PathLike) -> list[BaseTool]:
    """The tools declared in a YAML file (see the module docstring)."""
    key = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
    return tools_from_entries(read_yaml_list(path, "tools", key), where=f"{key}={os.fspath(path)!r}")


def load_all_tools(
    tool_config_path: str | os.PathLike | None, function_tool_path: str | os.PathLike | None
) -> list[Tool]:
    """The YAML's tools (built anew each call) followed by the Python file's function tools (registered once per
    process); every name must be unique across both."""
    native = initialize_tools_from_config(tool_config_path) if tool_config_path else []
    functions = load_function_tools_from_path(function_tool_path) if function_tool_path else []
    taken = {tool.name for tool in native}
    collisions = sorted(tool.name for tool in functions if tool.name in taken)
    if collisions:
        raise ValueError(
            f"function tools {collisions} in {os.fspath(function_tool_path)!r} collide with tools declared in "
            f"{os.fspath(tool_config_path)!r}; each tool name must be unique across tool_config_path and "
            "function_tool_path. Rename one of them."
        )
    return native + functions
