"""Tool YAML config: built-in names, import paths, and clear errors at start-up."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from hyflow.agent.tools import BaseTool
from hyflow.agent.tools.calculator import CalculatorTool
from hyflow.agent.tools.function_tool import FunctionTool
from hyflow.agent.tools.python_executor import PythonTool
from hyflow.agent.tools.registry import initialize_tools_from_config, load_all_tools


def write(tmp_path, text: str) -> str:
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_tools_load_by_built_in_name_or_import_path_with_config_and_schema(tmp_path):
    path = write(
        tmp_path,
        """
        tools:
          - class_name: calculator
            config: {timeout: 2}
          - class_name: hyflow.agent.tools.python_executor.PythonTool
            config: {time_limit: 1}
            tool_schema:
              type: function
              function:
                name: run_code
                description: run it
                parameters: {type: object, properties: {code: {type: string}}, required: [code]}
        """,
    )
    calculator, python = initialize_tools_from_config(path)
    assert isinstance(calculator, CalculatorTool) and calculator.config.timeout == 2
    assert isinstance(python, PythonTool) and python.name == "run_code" and python.config.time_limit == 1


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "- class_name: calculater",
            r"class_name='calculater' is neither a built-in.*\['calculator', 'image_zoom', 'python'",
        ),
        ("- class_name: hyflow.agent.tools.nope.Tool", "cannot be imported"),
        ("- class_name: hyflow.agent.tools.base.ToolResponse", "is not a subclass of BaseTool"),
        ("- {class_name: calculator, confg: {}}", r"unknown: \['confg'\]"),
        ("- class_name: calculator\n  - class_name: calculator", r"tool names \['calculator'\] appear more than once"),
    ],
)
def test_bad_tool_entries_fail_at_start_up_with_a_clear_message(tmp_path, entry, message):
    path = write(tmp_path, "tools:\n  " + entry + "\n")
    with pytest.raises(ValueError, match=message):
        initialize_tools_from_config(path)


def test_a_missing_file_or_a_wrong_shape_names_the_config_key(tmp_path):
    with pytest.raises(ValueError, match=r"tool_config_path='.*absent.yaml' does not exist"):
        initialize_tools_from_config(tmp_path / "absent.yaml")
    with pytest.raises(ValueError, match="must hold a list of mappings under 'tools:'"):
        initialize_tools_from_config(write(tmp_path, "tool:\n  - class_name: calculator\n"))


FUNCTION_TOOLS = '''
from hyflow.agent.tools.function_tool import function_tool


@function_tool
def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: what to shout.
    """
    return text.upper()
'''


def test_load_all_tools_adds_the_function_tools_of_a_python_file_to_the_yaml_tools(tmp_path):
    (tmp_path / "my_tools.py").write_text(FUNCTION_TOOLS)
    yaml_path = write(tmp_path, "tools:\n  - class_name: calculator\n")
    tools = load_all_tools(yaml_path, tmp_path / "my_tools.py")
    assert [tool.name for tool in tools] == ["calculator", "shout"]
    assert isinstance(tools[1], FunctionTool) and not isinstance(tools[1], BaseTool)
    response, _, _ = asyncio.run(tools[1].execute("id", {"text": "hi"}))
    assert response.text == "HI"
    assert load_all_tools(None, None) == []


def test_load_all_tools_builds_yaml_tools_anew_and_keeps_the_function_tools(tmp_path):
    (tmp_path / "my_tools.py").write_text(FUNCTION_TOOLS)
    yaml_path = write(tmp_path, "tools:\n  - class_name: calculator\n")
    first, second = (load_all_tools(yaml_path, tmp_path / "my_tools.py") for _ in range(2))
    assert first[0] is not second[0] and first[1] is second[1]


def test_load_all_tools_refuses_function_tools_named_like_yaml_tools_all_at_once(tmp_path):
    clash = FUNCTION_TOOLS.replace("def shout", "def calculator") + FUNCTION_TOOLS.replace("def shout", "def search")
    (tmp_path / "clash.py").write_text(clash)
    yaml_path = write(tmp_path, "tools:\n  - class_name: calculator\n  - class_name: search\n")
    with pytest.raises(ValueError, match=r"function tools \['calculator', 'search'\].*collide.*unique"):
        load_all_tools(yaml_path, tmp_path / "clash.py")


def test_load_all_tools_names_a_missing_python_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"function_tool_path does not exist: .*nope\.py"):
        load_all_tools(None, tmp_path / "nope.py")
