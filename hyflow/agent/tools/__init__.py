"""Tools an agent loop can call: the interface, the YAML loader and the built-ins (calculator, python, search,
image_zoom), and `function_tool` (a plain Python function as a tool)."""

from hyflow.agent.tools.base import BaseTool, ToolConfig, ToolResponse, validate_tool_schema
from hyflow.agent.tools.function_tool import function_schema, function_tool
from hyflow.agent.tools.registry import (
    BUILTIN_TOOLS,
    function_tools_from_path,
    initialize_tools_from_config,
    load_all_tools,
    tools_from_entries,
)

__all__ = [
    "BUILTIN_TOOLS",
    "BaseTool",
    "ToolConfig",
    "ToolResponse",
    "function_schema",
    "function_tool",
    "function_tools_from_path",
    "initialize_tools_from_config",
    "load_all_tools",
    "tools_from_entries",
    "validate_tool_schema",
]
