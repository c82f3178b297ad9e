"""Reward managers, registered by name (`reward_model.reward_manager`): `naive`, `batch`, `prime`, `dapo`.

    manager = get_reward_manager_cls("naive")(tokenizer, num_examine=1)
    result = manager(data, return_dict=True)      # {"reward_tensor": (B, R), "reward_extra_info": {...}}

A new manager subclasses `RewardManager`, sets `name`, decorates itself with `@register_reward_manager`, and lives
in a file of this package (every module here is imported on the first look-up).
"""

from __future__ import annotations

import importlib
import pkgutil

from hyflow.reward.managers.base import RewardManager, ScoringBatch

_MANAGERS: dict[str, type[RewardManager]] = {}
_ALL_IMPORTED = False

__all__ = ["RewardManager", "ScoringBatch", "get_reward_manager_cls", "register_reward_manager"]


def register_reward_manager(cls: type[RewardManager]) -> type[RewardManager]:
    """Class decorator: make `cls` selectable as `reward_model.reward_manager=<cls.name>`."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} needs a class attribute `name` to be registered.")
    existing = _MANAGERS.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"reward manager name {cls.name!r} is taken by {existing.__qualname__}; pick another name.")
    _MANAGERS[cls.name] = cls
    return cls


def _import_all() -> None:
    global _ALL_IMPORTED
    if not _ALL_IMPORTED:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
        _ALL_IMPORTED = True


def get_reward_manager_cls(name: str) -> type[RewardManager]:
    """The manager class registered as `name`; a ValueError lists the registered names otherwise."""
    _import_all()
    if name not in _MANAGERS:
        raise ValueError(
            f"reward_model.reward_manager={name!r} is not a registered reward manager; use one of {sorted(_MANAGERS)}."
        )
    return _MANAGERS[name]
