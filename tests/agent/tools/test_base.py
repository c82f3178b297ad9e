"""BaseTool: OpenAI schema validation, typed settings, the default lifecycle."""

from __future__ import annotations

import asyncio
import copy

import pytest

from hyflow.agent.tools.base import BaseTool, ToolResponse, validate_tool_schema
from hyflow.agent.tools.calculator import CalculatorTool
from hyflow.agent.tools.schemas import OpenAIFunctionToolSchema
from hyflow.agent.tools.search import SearchTool

GOOD = copy.deepcopy(CalculatorTool.default_schema)


def broken(path: list[str], value) -> dict:
    schema = copy.deepcopy(GOOD)
    node = schema
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return schema


def test_a_valid_schema_is_returned_unchanged():
    assert validate_tool_schema(GOOD) == GOOD


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "tool"}, "type 'function'"),
        (broken(["function", "name"], "has space"), "function.name='has space'"),
        (broken(["function", "parameters", "type"], "array"), "calculator.parameters: must be a mapping with type"),
        (
            broken(["function", "parameters", "properties", "expression"], {"type": "text"}),
            "expression: needs a 'type'",
        ),
        (broken(["function", "parameters", "required"], ["expr"]), r"not in properties: \['expr'\]"),
    ],
)
def test_invalid_schemas_are_rejected_with_the_offending_part(schema, message):
    with pytest.raises(ValueError, match=message):
        validate_tool_schema(schema)


def test_unknown_config_keys_are_rejected_with_a_suggestion():
    with pytest.raises(ValueError, match=r"unknown config key 'timout'. Did you mean 'timeout'\?"):
        CalculatorTool(config={"timout": 3})
    with pytest.raises(ValueError, match="topk=0 must be > 0"):
        SearchTool(config={"topk": 0})


def test_a_tool_without_any_schema_is_rejected():
    class Bare(BaseTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return ToolResponse(text=""), 0.0, {}

    with pytest.raises(ValueError, match="has no tool_schema"):
        Bare()


def test_the_default_lifecycle_keeps_instance_state_until_release():
    tool = CalculatorTool(config={"timeout": 3})
    instance, created = asyncio.run(tool.create(ground_truth="4"))
    assert created == ToolResponse() and tool.instances[instance] == {"ground_truth": "4"}
    assert tool.config.timeout == 3 == tool.timeout
    assert asyncio.run(tool.calc_reward(instance)) == 0.0
    asyncio.run(tool.release(instance))
    assert tool.instances == {}
    assert tool.missing_arguments({}) == ["expression"]


def test_a_tool_without_a_config_class_gets_its_config_as_a_dict_as_in_verl():
    class VerlStyle(BaseTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return ToolResponse(text=self.config["url"]), 0.0, {}

    tool = VerlStyle(config={"url": "http://x", "type": "native", "timeout": 4}, tool_schema=GOOD)
    assert tool.config == {"url": "http://x", "type": "native", "timeout": 4} and tool.timeout == 4.0
    assert VerlStyle(config={}, tool_schema=GOOD).timeout == 30.0
    with pytest.raises(ValueError, match="timeout='soon' must be a positive number"):
        VerlStyle(config={"timeout": "soon"}, tool_schema=GOOD)


def test_the_schema_is_kept_as_a_typed_model_and_a_given_model_is_used_as_is():
    tool = CalculatorTool()
    assert isinstance(tool.tool_schema, OpenAIFunctionToolSchema) and tool.tool_schema.function.name == "calculator"
    assert tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) == GOOD
    model = OpenAIFunctionToolSchema.model_validate(GOOD)
    assert CalculatorTool(tool_schema=model).get_openai_tool_schema() is model
