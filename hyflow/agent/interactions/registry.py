"""Load interactions from a YAML file (`actor_rollout_ref.rollout.multi_turn.interaction_config_path`).

interaction:
  - name: answer_check                      # the name samples select in interaction_kwargs["name"]
    class_name: answer_check                # a built-in name or an import path to a BaseInteraction subclass
    config: {}
"""

from __future__ import annotations

import os
from typing import Any

from hyflow.agent.interactions.base import BaseInteraction
from hyflow.agent.tools.registry import import_class, read_yaml_list

BUILTIN_INTERACTIONS: dict[str, str] = {
    "answer_check": "hyflow.agent.interactions.answer_check.AnswerCheckInteraction",
}
_ENTRY_KEYS = ("name", "class_name", "config")


def interactions_from_entries(
    entries: list[dict[str, Any]], where: str = "interaction config"
) -> dict[str, BaseInteraction]:
    """Instantiate interactions from `{name, class_name, config}` mappings, keyed by their unique names."""
    interactions: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(entries):
        unknown = sorted(set(entry) - set(_ENTRY_KEYS))
        if unknown or "class_name" not in entry:
            raise ValueError(
                f"{where}: interaction[{i}] has keys {sorted(entry)}; it needs 'class_name', may have 'name' and "
                f"'config' (unknown: {unknown})."
            )
        class_name = str(entry["class_name"])
        name = str(entry.get("name") or class_name.rpartition(".")[2])
        if name in interactions:
            raise ValueError(f"{where}: interaction name {name!r} appears more than once; names must be unique.")
        cls = import_class(class_name, BaseInteraction, f"{where}: interaction[{i}]", BUILTIN_INTERACTIONS)
        interactions[name] = cls(name=name, config=entry.get("config") or {})
    return interactions


def initialize_interactions_from_config(path: str | os.PathLike) -> dict[str, BaseInteraction]:
    """The interactions declared in a YAML file, by name (see the module docstring)."""
    key = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
    return interactions_from_entries(read_yaml_list(path, "interaction", key), where=f"{key}={os.fspath(path)!r}")
