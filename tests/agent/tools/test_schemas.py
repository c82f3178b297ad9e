"""Typed OpenAI tool schemas (hyflow.agent.tools.schemas): built and checked as pydantic models, read as dicts."""

import pydantic
import pytest

from hyflow.agent.tools.calculator import CalculatorTool
from hyflow.agent.tools.schemas import (
    OpenAIFunctionCallSchema,
    OpenAIFunctionParametersSchema,
    OpenAIFunctionParsedSchema,
    OpenAIFunctionPropertySchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
)


def calc_schema(name: str = "calc") -> OpenAIFunctionToolSchema:
    return OpenAIFunctionToolSchema(
        type="function",
        function=OpenAIFunctionSchema(
            name=name,
            description="Evaluate an arithmetic expression.",
            parameters=OpenAIFunctionParametersSchema(
                type="object",
                properties={"expression": OpenAIFunctionPropertySchema(type="string", description="e.g. 1+2")},
                required=["expression"],
            ),
        ),
    )


def test_a_tool_built_with_a_schema_model_keeps_that_model():
    schema = calc_schema("my_calc")
    tool = CalculatorTool(config={}, tool_schema=schema)
    assert tool.name == "my_calc" and tool.tool_schema is schema
    assert tool.tool_schema.function.parameters.required == ["expression"]


def test_union_types_and_non_string_enums_are_valid_properties():
    prop = OpenAIFunctionPropertySchema(type=["integer", "number"], enum=[1, 2, 3])
    assert prop.model_dump(exclude_none=True) == {"type": ["integer", "number"], "enum": [1, 2, 3]}


def test_a_function_without_parameters_gets_an_empty_object():
    function = OpenAIFunctionSchema(name="now", description="The time.")
    assert function.parameters.model_dump() == {"type": "object", "properties": {}, "required": []}


def test_a_schema_without_a_function_is_refused_when_built():
    with pytest.raises(pydantic.ValidationError, match="function"):
        OpenAIFunctionToolSchema(type="function")


@pytest.mark.parametrize(
    ("arguments", "decoded", "broken"), [('{"a": 1}', {"a": 1}, False), ("{oops", {}, True), ("[1]", {}, True)]
)
def test_parsed_arguments_decode_to_a_dict_or_report_the_broken_json(arguments, decoded, broken):
    parsed = OpenAIFunctionParsedSchema(name="f", arguments=arguments)
    call, has_error = OpenAIFunctionCallSchema.from_openai_function_parsed_schema(parsed)
    assert call.arguments == decoded and has_error is broken
