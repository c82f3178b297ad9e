"""Typed OpenAI function-tool schemas (pydantic) and `ToolResponse`, under the names of verl's `verl.tools.schemas`.

Every tool holds its schema as an `OpenAIFunctionToolSchema` (`tool.tool_schema`); a YAML entry or a
`default_schema` may give it as a plain dict, which `BaseTool` checks (`validate_tool_schema`, errors that name the
part) and turns into the model. `tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)` is the dict a
chat template reads; a parameter's other JSON-schema keys (`items`, `nullable`, `anyOf`, ...) are kept.

    schema = OpenAIFunctionToolSchema(
        type="function",
        function=OpenAIFunctionSchema(
            name="calc",
            description="Evaluate an arithmetic expression.",
            parameters=OpenAIFunctionParametersSchema(
                type="object", properties={"expr": OpenAIFunctionPropertySchema(type="string")}, required=["expr"]
            ),
        ),
    )
    CalculatorTool(config={}, tool_schema=schema)        # BaseTool accepts the model or the plain dict

A parsed call: `OpenAIFunctionParsedSchema(name=..., arguments='{"expr": "1+2"}')` (arguments as the model wrote
them, a JSON string) becomes `OpenAIFunctionCallSchema` (arguments as a dict) through
`OpenAIFunctionCallSchema.from_openai_function_parsed_schema`, which also says whether the JSON was broken.

The `tools` of an OpenAI chat request (any JSON schema a client sends, `description` and `parameters` optional)
become the models a tool parser reads through `request_tool_schemas(tools)`, leniently: the parsers only look up
each parameter's declared type, so a schema they cannot type is kept rather than refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolCall",
    "OpenAIFunctionToolSchema",
    "ToolResponse",
    "request_tool_schemas",
]


@dataclass
class ToolResponse:
    """What a tool call returns to the conversation: `text`, `image` (PIL images, `{"bytes", "path"}` or file
    paths) and `video` (each a list of frames, a GIF / animated WebP file, verl's `{"video": ..., "fps": ...}` or a
    `hyflow.data.video.Video`), which a vision-language model sees in front of the text, images first
    (`hyflow.agent.vision`; a text-only model's loop drops them with a warning)."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter: its JSON type (a list for unions, e.g. ["integer", "number"]), description and choices.
    Other JSON-schema keys (`items`, `nullable`, `anyOf`, ...) are kept as given; `type` may be left out beside
    `anyOf` or `enum`."""

    model_config = ConfigDict(extra="allow")

    type: str | list[str] | None = None
    description: str | None = None
    enum: list[Any] | None = None  # any JSON values: Literal[1, 2, 3] -> [1, 2, 3]


class OpenAIFunctionParametersSchema(BaseModel):
    """The parameters object: `type` is "object"; `required` names properties without a default."""

    type: str
    properties: dict[str, OpenAIFunctionPropertySchema]
    required: list[str] = Field(default_factory=list)


def _no_parameters() -> OpenAIFunctionParametersSchema:
    return OpenAIFunctionParametersSchema(type="object", properties={})


class OpenAIFunctionSchema(BaseModel):
    """A function the model may call: name, description, parameters."""

    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=_no_parameters)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """A tool in the OpenAI `tools` list: `{"type": "function", "function": {...}}`."""

    type: str
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A call as parsed from the model's text: the arguments are still a JSON string."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A call with decoded arguments."""

    name: str
    arguments: dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(
        parsed_schema: OpenAIFunctionParsedSchema,
    ) -> tuple[OpenAIFunctionCallSchema, bool]:
        """(the call, whether its arguments failed to decode); broken or non-object JSON gives arguments {}."""
        try:
            arguments = json.loads(parsed_schema.arguments)
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            return OpenAIFunctionCallSchema(name=parsed_schema.name, arguments={}), True
        return OpenAIFunctionCallSchema(name=parsed_schema.name, arguments=arguments), False


class OpenAIFunctionToolCall(BaseModel):
    """A call with its id, as in an assistant message's `tool_calls`."""

    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


def request_tool_schemas(tools: list[dict[str, Any]]) -> list[OpenAIFunctionToolSchema]:
    """The `tools` of an OpenAI chat request as schemas for a tool parser (`ToolParser.parse(text, tools)`): a
    missing description is "", missing parameters or properties are none. A ValueError names the tool whose
    function or parameters are not the JSON objects OpenAI's API describes."""
    schemas = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        parameters = function.get("parameters") if isinstance(function, dict) else None
        try:
            if not isinstance(function, dict) or not isinstance(parameters or {}, dict):
                raise TypeError("function and function.parameters must be JSON objects")
            parameters = {"type": "object", "properties": {}, **(parameters or {})}
            spec = {**tool, "function": {"description": "", **function, "parameters": parameters}}
            schemas.append(OpenAIFunctionToolSchema.model_validate(spec))
        except (TypeError, ValueError) as error:
            name = function.get("name") if isinstance(function, dict) else None
            problem = error
            if isinstance(error, ValidationError):
                problem = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            raise ValueError(
                f"tools[{index}] ({name!r}) is not an OpenAI function tool ({problem}); send {{'type': 'function', "
                "'function': {'name': ..., 'parameters': {'type': 'object', 'properties': {NAME: {'type': ...}}}}}"
            ) from error
    return schemas
