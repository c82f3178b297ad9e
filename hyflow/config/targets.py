"""`omega_conf_to_dataclass`: a config dataclass built from a mapping, its class named by `_target_` (verl's way).

    optim = omega_conf_to_dataclass({"_target_": "hyflow.config.verl_engine.FSDPOptimizerConfig", "lr": 1e-6})
    optim = omega_conf_to_dataclass({"lr": 1e-6}, FSDPOptimizerConfig)         # the class given instead

Nested mappings become the dataclass of their own `_target_`, else of the field's declared type; every key must
be a field of its class (a typo gets the closest field). Only dataclasses are built: a `_target_` naming another
kind of object is refused, so a config file cannot call arbitrary code. The classes check their own values.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import typing
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hyflow.config.convert import _unwrap_optional

__all__ = ["omega_conf_to_dataclass"]

TARGET = "_target_"


def _resolve_target(target: str, where: str) -> type:
    module_name, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"{where}{TARGET}={target!r} names no importable class ({error}). Fix: correct it.") from None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"{where}{TARGET}={target!r} is not a config dataclass; only those are built from configs.")
    return cls


def _build(data: Mapping[str, Any], cls: type | None, where: str) -> Any:
    if TARGET in data:
        cls = _resolve_target(str(data[TARGET]), where)
    if cls is None:
        raise ValueError(f"{where or 'the config'} has no {TARGET!r} and no dataclass was given to build it as.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs = {}
    for key, value in data.items():
        if key == TARGET:
            continue
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"Did you mean {close[0]!r}?" if close else f"Its fields: {', '.join(names)}."
            raise ValueError(f"{where}{key} is not a field of {cls.__name__}. {hint} Fix: correct or remove it.")
        declared = _unwrap_optional(hints[key])
        if isinstance(value, Mapping) and (TARGET in value or dataclasses.is_dataclass(declared)):
            value = _build(value, declared if dataclasses.is_dataclass(declared) else None, f"{where}{key}.")
        kwargs[key] = value
    return cls(**kwargs)


def omega_conf_to_dataclass(config: DictConfig | Mapping[str, Any] | None, dataclass_type: type | None = None) -> Any:
    """The dataclass `config` describes (interpolations resolved); None for None. A `_target_` in `config` wins
    over `dataclass_type`. Raises ValueError naming the key for an unknown field or target."""
    if config is None:
        return None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return config  # already built
    data = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else dict(config)
    return _build(data, dataclass_type, "")
