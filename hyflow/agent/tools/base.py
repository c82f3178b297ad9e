"""The tool interface: `BaseTool` (create / execute / calc_reward / release), `ToolResponse`, schema checks.

A tool is declared with its OpenAI function schema, which the chat template shows to the model:

    {"type": "function", "function": {"name": "calculator", "description": "...",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}

`tool.tool_schema` holds it as an `OpenAIFunctionToolSchema` (`hyflow.agent.tools.schemas`, verl's type), checked
when the tool is built. Lifecycle inside one episode: `create` once (with the sample's
`tools_kwargs[name]["create_kwargs"]`; it returns `(instance_id, ToolResponse)` as in verl 0.9), `execute` per call,
`calc_reward` at the end, `release` always (also when the episode fails).

Settings: a tool that sets `config_class` (a dataclass; all of hyflow's do) gets its YAML `config:` mapping as that
dataclass, unknown keys rejected. A tool that does not (a verl tool) gets the mapping as a plain dict, as in verl.
Either way `config.timeout` (default 30 s) becomes `tool.timeout`, the cut-off of each hook call (the agent loop
runs every hook on a worker thread of its own: hyflow/agent/tools/hook_runner.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from hyflow.agent.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool", "ToolConfig", "ToolResponse", "missing_arguments", "validate_tool_schema"]

JSON_TYPES = ("string", "number", "integer", "boolean", "array", "object", "null")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_TIMEOUT = 30.0


@dataclass
class ToolConfig:
    """Settings every tool has. Subclass it (as a dataclass) to add a tool's own settings."""

    type: str = "native"  # verl compatibility; hyflow tools are always in-process ("native")
    timeout: float = DEFAULT_TIMEOUT  # seconds one hook call (create, execute, ...) may take before it is cut off


def build_config(config_class: type, values: dict[str, Any] | None, where: str) -> Any:
    """Instantiate a config dataclass from a dict, naming unknown keys (with a close match) and the allowed ones."""
    values = dict(values or {})
    allowed = [f.name for f in dataclasses.fields(config_class)]
    for key in values:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{where}: unknown config key {key!r}.{hint} Allowed keys: {allowed}.")
    return config_class(**values)


def _schema_error(where: str, problem: str) -> ValueError:
    return ValueError(
        f"tool schema {where}: {problem}. A tool schema looks like {{'type': 'function', 'function': {{'name': ..., "
        "'description': ..., 'parameters': {'type': 'object', 'properties': {...}, 'required': [...]}}}."
    )


def validate_tool_schema(schema: Any) -> dict[str, Any]:
    """Check an OpenAI function-tool schema and return it; a ValueError names the offending part."""
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(schema.get("function"), dict):
        raise _schema_error(repr(schema)[:80], "must be a mapping with type 'function' and a 'function' mapping")
    function = schema["function"]
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _schema_error(f"function.name={name!r}", "must be 1-64 letters, digits, '_' or '-'")
    if not isinstance(function.get("description", ""), str):
        raise _schema_error(f"{name}.description", "must be a string")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise _schema_error(f"{name}.parameters", "must be a mapping with type 'object'")
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        raise _schema_error(f"{name}.parameters.properties", "must be a mapping of parameter name to schema")
    for prop, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        kinds = spec.get("type") if isinstance(spec.get("type"), list) else [spec.get("type")]
        if not (all(k in JSON_TYPES for k in kinds) or "enum" in spec or "anyOf" in spec):
            raise _schema_error(f"{name}.parameters.properties.{prop}", f"needs a 'type' from {list(JSON_TYPES)}")
    required = parameters.get("required", [])
    missing = [key for key in required if key not in properties]
    if not isinstance(required, list) or missing:
        raise _schema_error(f"{name}.parameters.required", f"lists parameters not in properties: {missing}")
    return schema


def as_schema_model(schema: dict[str, Any] | OpenAIFunctionToolSchema) -> OpenAIFunctionToolSchema:
    """The schema as an `OpenAIFunctionToolSchema`: a model is kept as it is, a dict is checked first."""
    if isinstance(schema, OpenAIFunctionToolSchema):
        return schema
    return OpenAIFunctionToolSchema.model_validate(validate_tool_schema(schema))


def missing_arguments(schema: OpenAIFunctionToolSchema, arguments: dict[str, Any]) -> list[str]:
    """Required parameters of the schema that a call left out."""
    return [key for key in schema.function.parameters.required if key not in arguments]


class BaseTool(ABC):
    """A tool the model can call. Subclasses implement `execute`; override the other hooks when they hold state.

    `config_class` is the dataclass of the tool's settings (None: a plain dict, verl's contract);
    `default_schema` lets a YAML entry omit `tool_schema`. `self.name` is the function name in the schema, the name
    the model calls. A tool that works on the sample's images sets `takes_images = True`.
    """

    config_class: ClassVar[type | None] = None
    default_schema: ClassVar[dict[str, Any] | None] = None
    takes_images: ClassVar[bool] = False  # True: `create` gets the prompt's images as `image_data=[PIL images]`

    def __init__(
        self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | OpenAIFunctionToolSchema | None = None
    ) -> None:
        where = f"tool {type(self).__name__}"
        if self.config_class is None:
            self.config: Any = dict(config or {})
            timeout = self.config.get("timeout", DEFAULT_TIMEOUT)
        else:
            self.config = build_config(self.config_class, config, where=where)
            timeout = getattr(self.config, "timeout", DEFAULT_TIMEOUT)
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"{where}: config timeout={timeout!r} must be a positive number of seconds.")
        self.timeout = float(timeout)
        schema = tool_schema if tool_schema is not None else self.default_schema
        if schema is None:
            raise ValueError(
                f"{where} has no tool_schema: add a `tool_schema:` to its entry in the tool config YAML (OpenAI "
                "function format)."
            )
        self.tool_schema = as_schema_model(schema)
        self.name: str = self.tool_schema.function.name
        self.instances: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The schema (verl's accessor)."""
        return self.tool_schema

    def missing_arguments(self, arguments: dict[str, Any]) -> list[str]:
        """Required parameters of the schema that a call left out."""
        return missing_arguments(self.tool_schema, arguments)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start one episode's instance of the tool; `kwargs` are the sample's create_kwargs (kept in
        `self.instances[instance_id]`). Returns (its id, a creation response: empty here)."""
        instance_id = instance_id or uuid.uuid4().hex
        self.instances[instance_id] = dict(kwargs)
        return instance_id, ToolResponse()

    @abstractmethod
    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run one call. Returns (the response for the conversation, a step reward, metrics)."""

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The tool's reward for the whole episode (0 unless the tool scores something)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Free the instance's resources. Always called, also when the episode failed."""
        self.instances.pop(instance_id, None)
