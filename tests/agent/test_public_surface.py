"""The agent package's public names, its shipped YAML configs, its light import, and its import graph."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import hyflow.agent
from hyflow.agent import parser_base, parsers, rollout_endpoint
from hyflow.agent.interactions.registry import initialize_interactions_from_config
from hyflow.agent.tools.registry import initialize_tools_from_config
from tests.engine.test_package import find_cycle, imported_engine_modules

CONFIGS = Path(hyflow.agent.__file__).parent / "configs"


def test_the_documented_names_import_from_hyflow_agent():
    from hyflow.agent import (  # noqa: F401
        AgentLoopBase,
        AgentLoopOutput,
        BaseInteraction,
        BaseTool,
        FunctionCall,
        ToolParser,
        ToolResponse,
        register_agent_loop,
    )

    assert all(getattr(hyflow.agent, name) is not None for name in hyflow.agent.__all__)


def test_the_shipped_configs_load():
    assert [tool.name for tool in initialize_tools_from_config(CONFIGS / "calculator_tool.yaml")] == ["calculator"]
    assert list(initialize_interactions_from_config(CONFIGS / "answer_check_interaction.yaml")) == ["answer_check"]


def test_the_retrieval_server_imports_without_torch():
    code = "import sys, hyflow.agent.retrieval_server; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def agent_import_graph() -> dict[str, set[str]]:
    """Module -> the hyflow.agent modules it imports anywhere (top level, in functions, under TYPE_CHECKING); the
    packages' __init__ files re-export lazily and are left out, as in the engine's check."""
    root = Path(hyflow.agent.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    known = set(modules)
    return {
        name: set() if name in packages else imported_engine_modules(path, known) - packages - {name}
        for name, path in modules.items()
    }


def test_the_agent_modules_import_one_another_without_cycles():
    graph = agent_import_graph()
    assert {"hyflow.agent.parsers", "hyflow.agent.openai_endpoint", "hyflow.agent.tools.base"} <= set(graph)
    assert find_cycle(graph) is None


def test_names_moved_to_break_import_cycles_keep_their_public_import_paths():
    assert parsers.FunctionCall is parser_base.FunctionCall and parsers.ToolParser is parser_base.ToolParser
    assert {"hermes", "qwen3_coder", "kimi", "gpt-oss"} <= set(parsers.ToolParser.names())
    openai_agent = importlib.import_module("hyflow.agent.openai_agent")  # the package's `openai_agent` is the decorator
    assert openai_agent.HistoryRewritten is rollout_endpoint.HistoryRewritten
    assert openai_agent.RolloutEndpoint is rollout_endpoint.RolloutEndpoint
