"""Agent loops: single-turn and multi-turn (tool-calling) rollouts over the async generation API.

    from hyflow.agent import AgentLoopManager, LocalEngineServer
    manager = AgentLoopManager(config.actor_rollout_ref.rollout, tokenizer, servers=[LocalEngineServer(async_engine)])
    gen_batch = manager.generate_sequences(batch)

Extension points: `@register_agent_loop(name)` (a new loop), `@ToolParser.register(name)` (a tool-call format),
`BaseTool` subclasses and `BaseInteraction` subclasses listed in YAML (tools and simulated users).

The names below are imported on first use (PEP 562), so light entry points such as `hyflow serve-retrieval`
(`hyflow.agent.retrieval_server`) start without loading torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "AgentData": "hyflow.agent.loop",
    "AgentLoopBase": "hyflow.agent.loop",
    "AgentLoopContext": "hyflow.agent.loop",
    "AgentLoopMetrics": "hyflow.agent.loop",
    "AgentLoopOutput": "hyflow.agent.loop",
    "get_agent_loop_class": "hyflow.agent.loop",
    "register_agent_loop": "hyflow.agent.loop",
    "AgentLoopManager": "hyflow.agent.manager",
    "FunctionCall": "hyflow.agent.parsers",
    "ParsedToolCalls": "hyflow.agent.parsers",
    "ToolParser": "hyflow.agent.parsers",
    "AsyncLLMServer": "hyflow.agent.server",
    "LocalEngineServer": "hyflow.agent.server",
    "ServerRouter": "hyflow.agent.server",
    "TokenOutput": "hyflow.agent.server",
    "WorkerServer": "hyflow.agent.server",
    "OpenAIAgentLoop": "hyflow.agent.openai_agent",
    "openai_agent": "hyflow.agent.openai_agent",
    "openai_agent_loop": "hyflow.agent.openai_agent",
    "SingleTurnAgentLoop": "hyflow.agent.single_turn",
    "AgentState": "hyflow.agent.tool_agent",
    "ToolAgentLoop": "hyflow.agent.tool_agent",
    "BaseTool": "hyflow.agent.tools.base",
    "ToolResponse": "hyflow.agent.tools.base",
    "initialize_tools_from_config": "hyflow.agent.tools.registry",
    "BaseInteraction": "hyflow.agent.interactions.base",
    "initialize_interactions_from_config": "hyflow.agent.interactions.registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hyflow.agent' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
