"""Typed OpenAI function-tool schemas (pydantic), under the names verl's `verl.tools.schemas` uses.

A tool's schema as a model instead of a dict: it is checked when it is built, and `model_dump()` gives the dict
that tools, parsers and chat templates read.

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
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from hyflow.agent.tools.base import ToolResponse  # verl keeps it in this module; hyflow's lives in base.py

__all__ = [
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolCall",
    "OpenAIFunctionToolSchema",
    "ToolResponse",
]


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter: its JSON type (a list for unions, e.g. ["integer", "number"]), description and choices."""

    type: str | list[str]
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
