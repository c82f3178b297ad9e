"""The agent package's public names, its shipped YAML configs, and its light import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import hyflow.agent
from hyflow.agent.interactions.registry import initialize_interactions_from_config
from hyflow.agent.tools.registry import initialize_tools_from_config

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
