"""The interaction interface: a simulated user that answers the model between its turns.

An interaction is chosen per sample by `interaction_kwargs["name"]` (the row's `interaction_kwargs`, or
`extra_info["interaction_kwargs"]`); the other keys of that mapping reach `start_interaction`. After each model turn
without tool calls, `ToolAgentLoop` calls `generate_response`, appends the reply as a user message (response_mask
0) and lets the model answer again, until the interaction ends the episode or `multi_turn.max_user_turns` is hit.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from hyflow.agent.tools.base import build_config


@dataclass
class InteractionConfig:
    """Settings every interaction has; subclass it (as a dataclass) for an interaction's own settings."""


class BaseInteraction(ABC):
    """A simulated user. Subclasses implement `generate_response`; the other hooks keep per-episode state."""

    config_class: ClassVar[type] = InteractionConfig

    def __init__(self, name: str, config: dict[str, Any] | None = None) -> None:
        self.name = name
        self.config = build_config(self.config_class, config, where=f"interaction {name!r}")
        self.instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Start one episode; `kwargs` are the sample's interaction_kwargs (without `name`). Returns its id."""
        instance_id = instance_id or uuid.uuid4().hex
        self.instances[instance_id] = {"kwargs": dict(kwargs), "score": 0.0}
        return instance_id

    @abstractmethod
    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """React to the conversation so far: (should_terminate, user reply, turn reward, metrics)."""

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """The interaction's score for the episode (by default the last turn's reward)."""
        return float(self.instances.get(instance_id, {}).get("score", 0.0))

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Free the episode's state. Always called, also when the episode failed."""
        self.instances.pop(instance_id, None)
