"""Simulated users for multi-turn episodes: the interface, the YAML loader and the built-in `answer_check`."""

from hyflow.agent.interactions.base import BaseInteraction, InteractionConfig
from hyflow.agent.interactions.registry import (
    BUILTIN_INTERACTIONS,
    initialize_interactions_from_config,
    interactions_from_entries,
)

__all__ = [
    "BUILTIN_INTERACTIONS",
    "BaseInteraction",
    "InteractionConfig",
    "initialize_interactions_from_config",
    "interactions_from_entries",
]
