"""Tools an agent loop can call: the interface, the YAML loader and the built-ins (calculator, python, search,
image_zoom). A plain Python function as a tool: `hyflow.agent.tools.function_tool` (verl's module path; the
package attribute `function_tool` is that module, as in verl)."""

from hyflow.agent.tools import function_tool  # noqa: F401  (the module, not its decorator)
from hyflow.agent.tools.base import BaseTool, ToolConfig, ToolResponse, validate_tool_schema
from hyflow.agent.tools.registry import BUILTIN_TOOLS, initialize_tools_from_config, load_all_tools, tools_from_entries

__all__ = [
    "BUILTIN_TOOLS",
    "BaseTool",
    "ToolConfig",
    "ToolResponse",
    "initialize_tools_from_config",
    "load_all_tools",
    "tools_from_entries",
    "validate_tool_schema",
]
