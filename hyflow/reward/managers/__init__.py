"""Reward managers, registered by name (`reward_model.reward_manager`): `naive`, `batch`, `prime`, `dapo`.

    manager = get_reward_manager_cls("naive")(tokenizer, num_examine=1)
    result = manager(data, return_dict=True)      # {"reward_tensor": (B, R), "reward_extra_info": {...}}

A new manager subclasses `RewardManager`, sets `name`, decorates itself with `@register_reward_manager`, and lives
in a file of this package (every module here is imported on the first look-up). Code ported from verl keeps its
spelling: `@register("my_manager")` and `REWARD_MANAGER_REGISTRY`, the name -> class dict itself.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from hyflow.reward.managers.base import RewardManager, ScoringBatch

REWARD_MANAGER_REGISTRY: dict[str, type[RewardManager]] = {}
_ALL_IMPORTED = False

__all__ = [
    "REWARD_MANAGER_REGISTRY",
    "RewardManager",
    "ScoringBatch",
    "get_reward_manager_cls",
    "register",
    "register_reward_manager",
]


def _add(name: str, cls: type) -> type:
    existing = REWARD_MANAGER_REGISTRY.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"reward manager name {name!r} is taken by {existing.__qualname__}; pick another name.")
    REWARD_MANAGER_REGISTRY[name] = cls
    return cls


def register_reward_manager(cls: type[RewardManager]) -> type[RewardManager]:
    """Class decorator: make `cls` selectable as `reward_model.reward_manager=<cls.name>`."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} needs a class attribute `name` to be registered.")
    return _add(cls.name, cls)


def register(name: str) -> Callable[[type], type]:
    """verl's decorator: `@register("my_manager")` registers the class under that name."""
    return lambda cls: _add(name, cls)


def _import_all() -> None:
    global _ALL_IMPORTED
    if not _ALL_IMPORTED:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
        _ALL_IMPORTED = True


def get_reward_manager_cls(name: str) -> type[RewardManager]:
    """The manager class registered as `name`; a ValueError lists the registered names otherwise."""
    _import_all()
    if name not in REWARD_MANAGER_REGISTRY:
        raise ValueError(
            f"Unknown reward manager: {name} (reward_model.reward_manager={name!r}); use one of "
            f"{sorted(REWARD_MANAGER_REGISTRY)}, or register yours with @register_reward_manager."
        )
    return REWARD_MANAGER_REGISTRY[name]
