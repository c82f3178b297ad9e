"""Between plain nested dicts (what Hydra and OmegaConf hold) and the typed config dataclasses.

- `default_dict()`: the defaults of `PPOTrainerConfig` as a plain dict: the one source Hydra's `ppo_trainer`
  config is made from.
- `to_dataclass(cls, data, ...)`: build a dataclass from a dict, checking every key and every value's type and
  choices, and collecting one message per problem instead of stopping at the first.
- `resolve_key(key)`: what a dotted command-line key means: a config key, a verl spelling of one, a verl key
  hyflow accepts and ignores, one it does not implement, or a typo (with the closest valid key).
- `fill_inherited(config)`: give `inherit(...)` fields left `None` the value of the key they inherit from.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import logging
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

from hyflow.config.ppo_trainer import PPOTrainerConfig
from hyflow.config.verl_compat import (
    aliased_value,
    ignored_reason,
    is_verl_default,
    renamed_key,
    unsupported_reason,
    unsupported_value_reason,
)

logger = logging.getLogger(__name__)

_INVALID = object()  # marks a value that failed conversion (its problem is already recorded)
_NO_VALUE = object()  # resolve_key called without the value being set


def default_dict(cls: type = PPOTrainerConfig) -> dict[str, Any]:
    """The defaults of a config dataclass as a plain nested dict. An inherited or derived field is None: `finalize`
    fills it once the user's values are known (`--cfg job` prints the filled config)."""
    return _instance_to_defaults(cls())


def _instance_to_defaults(instance: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if "inherit" in f.metadata or f.metadata.get("derived"):
            value = None
        elif dataclasses.is_dataclass(value):
            value = _instance_to_defaults(value)
        elif isinstance(value, list):
            value = [_instance_to_defaults(v) if dataclasses.is_dataclass(v) else copy.deepcopy(v) for v in value]
        else:
            value = copy.deepcopy(value)
        out[f.name] = value
    return out


def to_plain_dict(config: Any) -> dict[str, Any]:
    """A config dataclass (after loading) as a plain nested dict."""
    return dataclasses.asdict(config)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _unwrap_optional(hint: Any) -> Any:
    if typing.get_origin(hint) in (Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(options) == 1:
            return options[0]
    return hint


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# ---------------------------------------------------------------------------------------------- key lookup


@functools.cache
def all_keys(cls: type = PPOTrainerConfig, prefix: str = "") -> tuple[str, ...]:
    """Every dotted key of the schema, sections and leaves."""
    keys: list[str] = []
    for name, hint in _field_types(cls).items():
        key = _join(prefix, name)
        keys.append(key)
        inner = _unwrap_optional(hint)
        if dataclasses.is_dataclass(inner):
            keys.extend(all_keys(inner, key))
    return tuple(keys)


def suggest_key(key: str, level_names: list[str] | None = None, prefix: str = "") -> str | None:
    """The valid key closest to a mistyped one: a near spelling at the same level, the same name in another
    section (`actor_rollout_ref.actor.n` -> `actor_rollout_ref.rollout.n`), or the nearest full key."""
    last = key.rsplit(".", 1)[-1]
    if level_names:
        close = difflib.get_close_matches(last, level_names, n=1, cutoff=0.6)
        if close:
            return _join(prefix, close[0])
    keys = all_keys()
    same_name = [k for k in keys if k.rsplit(".", 1)[-1] == last and k != key]
    if same_name:
        return (difflib.get_close_matches(key, same_name, n=1, cutoff=0.0) or same_name)[0]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_key_message(key: str, level_names: list[str], prefix: str) -> str:
    """The message for a key that is not in the schema, with the closest valid key or the valid keys there."""
    suggestion = suggest_key(key, level_names, prefix)
    if suggestion:
        hint = f"Did you mean {suggestion!r}?"
    else:
        hint = f"Valid keys under {prefix or 'the root'}: {', '.join(sorted(level_names))}."
    return f"unknown key {key!r}: it is not a hyflow (or verl) config key. {hint} Fix: correct or remove it."


def unsupported_key_message(key: str, reason: str) -> str:
    return f"{key!r} is a verl key for {reason}, which hyflow does not implement. Fix: remove {key} from the command."


@dataclass
class KeyStatus:
    """What a dotted key from the command line means. kind: ok | ignored | invalid."""

    kind: Literal["ok", "ignored", "invalid"]
    key: str
    message: str = ""


def resolve_key(key: str, value: Any = _NO_VALUE) -> KeyStatus:
    """Map a command-line key to hyflow's key, or say why it is ignored or invalid (renames log a notice).
    `value` matters only for verl features hyflow lacks: switched off (false / null / verl's default), they are
    accepted."""
    renamed = renamed_key(key)
    if renamed is not None:
        logger.warning("config: %r is the verl spelling of %r; reading it as %r.", key, renamed, renamed)
        key = renamed
    cls: Any = PPOTrainerConfig
    prefix = ""
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            if typing.get_origin(cls) is dict or cls is dict:
                return KeyStatus("ok", key)  # a free-form mapping such as model.override_config
            message = f"{key!r} does not exist: {prefix!r} is a value, not a section. Fix: set {prefix}=VALUE."
            return KeyStatus("invalid", key, message)
        types_here = _field_types(cls)
        if part not in types_here:
            return _classify_missing(key, list(types_here), prefix, value)
        cls = _unwrap_optional(types_here[part])
        prefix = _join(prefix, part)
    return KeyStatus("ok", key)


def _classify_missing(key: str, level_names: list[str], prefix: str, value: Any) -> KeyStatus:
    reason = ignored_reason(key)
    if reason is not None:
        return KeyStatus("ignored", key, f"config: ignoring verl key {key!r}: {reason}.")
    reason = unsupported_reason(key)
    if reason is not None and (value in (False, None) or is_verl_default(key, value)):
        return KeyStatus("ignored", key, f"config: ignoring {key}={value}: hyflow does not implement {reason}.")
    if reason is not None:
        return KeyStatus("invalid", key, unsupported_key_message(key, reason))
    return KeyStatus("invalid", key, unknown_key_message(key, level_names, prefix))


# ---------------------------------------------------------------------------------------------- conversion


def to_dataclass(
    cls: type, data: Mapping[str, Any], prefix: str, problems: list[str], invalid_keys: set[str] | None = None
) -> Any:
    """Build `cls` from `data`, appending a message to `problems` for every unknown key or bad value (and the key
    of every bad value to `invalid_keys`, when given).

    Keys missing from `data` take the dataclass default. Returns the instance (built from the valid keys only
    when there were problems; the caller raises once all sections are checked).
    """
    data = _apply_renames(copy.deepcopy(dict(data))) if not prefix else dict(data)
    types_here = _field_types(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = _join(prefix, str(name))
        if name not in types_here:
            status = _classify_missing(key, list(types_here), prefix, value)
            if status.kind == "ignored":
                logger.warning(status.message)
            else:
                problems.append(status.message)
            continue
        hint = types_here[name]
        if dataclasses.is_dataclass(_unwrap_optional(hint)) and isinstance(value, Mapping):
            converted = to_dataclass(_unwrap_optional(hint), value, key, problems, invalid_keys)
        else:
            converted = convert_value(value, hint, key, problems)
        if converted is not _INVALID:
            kwargs[name] = converted
        elif invalid_keys is not None:
            invalid_keys.add(key)
    return cls(**kwargs)


def _apply_renames(data: dict[str, Any]) -> dict[str, Any]:
    """Move every value at a verl spelling to hyflow's key, anywhere in the tree (keys are full paths from the
    root, so a rename may change sections: `actor_rollout_ref.actor.optim.clip_grad` -> `...actor.grad_clip`)."""
    moves: list[tuple[str, str]] = []
    _collect_renames(data, "", moves)
    for key, target in moves:
        *parents, leaf = key.split(".")
        node = data
        for parent in parents:
            node = node[parent]
        value = node.pop(leaf)
        logger.warning("config: %r is the verl spelling of %r; reading it as %r.", key, target, target)
        *parents, leaf = target.split(".")
        node = data
        for parent in parents:
            node = node.setdefault(parent, {})
        if isinstance(value, Mapping) and isinstance(node.get(leaf), Mapping):
            node[leaf] = {**node[leaf], **value}
        else:
            node[leaf] = value
    return data


def _collect_renames(node: Mapping[str, Any], prefix: str, moves: list[tuple[str, str]]) -> None:
    for name, value in node.items():
        key = _join(prefix, str(name))
        target = renamed_key(key)
        if target is not None:
            moves.append((key, target))
        elif isinstance(value, Mapping):
            _collect_renames(value, key, moves)


def convert_value(value: Any, hint: Any, key: str, problems: list[str]) -> Any:
    """Check `value` against the type `hint` of `key`; return it (converted) or `_INVALID` after recording why."""
    value = aliased_value(key, value)
    reason = unsupported_value_reason(key, value)
    if reason is not None:
        problems.append(reason)
        return _INVALID
    origin = typing.get_origin(hint)
    if hint is Any:
        return copy.deepcopy(value)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, Mapping):
            return to_dataclass(hint, value, key, problems)
        return _wrong_type(key, value, hint, problems)
    if origin in (Union, types.UnionType):
        return _convert_union(value, hint, key, problems)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if any(value == a and type(value) is type(a) for a in allowed):
            return value
        shown = ", ".join(repr(a) for a in allowed)
        problems.append(f"{key}={value!r} is not an allowed value. Allowed values: {shown}. Fix: pick one of them.")
        return _INVALID
    if origin is list:
        return _convert_list(value, hint, key, problems)
    if origin is dict or hint is dict:
        if isinstance(value, Mapping):
            return copy.deepcopy(dict(value))
        return _wrong_type(key, value, hint, problems)
    return _convert_scalar(value, hint, key, problems)


def _convert_union(value: Any, hint: Any, key: str, problems: list[str]) -> Any:
    args = typing.get_args(hint)
    if value is None and type(None) in args:
        return None
    options = [a for a in args if a is not type(None)]
    trial: list[str] = []
    for option in options:
        trial = []
        converted = convert_value(value, option, key, trial)
        if not trial:
            return converted
    if len(options) == 1:
        problems.extend(trial)  # Optional[X]: X's own message is the precise one
        return _INVALID
    return _wrong_type(key, value, hint, problems)


def _convert_list(value: Any, hint: Any, key: str, problems: list[str]) -> Any:
    (item_hint,) = typing.get_args(hint) or (Any,)
    if isinstance(value, str) and (item_hint is str or typing.get_origin(item_hint) is Literal):
        value = [value]  # verl accepts `trainer.logger=console` for `["console"]`
    if not isinstance(value, list | tuple):
        return _wrong_type(key, value, hint, problems)
    items = [convert_value(item, item_hint, f"{key}[{i}]", problems) for i, item in enumerate(value)]
    return _INVALID if any(item is _INVALID for item in items) else items


def _convert_scalar(value: Any, hint: Any, key: str, problems: list[str]) -> Any:
    if hint is bool and isinstance(value, bool):
        return value
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint is str and isinstance(value, str):
        return value
    if hint is str and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # `trainer.experiment_name=2024` arrives as an int from the command line
    return _wrong_type(key, value, hint, problems)


def describe_type(hint: Any) -> str:
    """A type in words, for messages: `int | None` -> 'an integer or null'."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in typing.get_args(hint))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return f"a list of ({describe_type(item)})"
    if origin is dict or hint is dict:
        return "a mapping"
    if dataclasses.is_dataclass(hint):
        return "a section (a mapping of keys)"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _wrong_type(key: str, value: Any, hint: Any, problems: list[str]) -> Any:
    expected = describe_type(hint)
    default = _default_of(key)
    example = f" (default: {key}={default!r})" if default is not _INVALID else ""
    problems.append(
        f"{key}={value!r} has the wrong type: expected {expected}, got {type(value).__name__}. "
        f"Fix: set {key} to {expected}{example}."
    )
    return _INVALID


def _default_of(key: str) -> Any:
    node: Any = default_dict()
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _INVALID
        node = node[part]
    return node


# ---------------------------------------------------------------------------------------------- inheritance


def fill_inherited(config: PPOTrainerConfig) -> None:
    """Set every `inherit(path)` field that is still None to the value at `path` (in place, chains resolved)."""
    for _ in range(4):  # chains are at most a couple of links long
        if not _fill_pass(config, config):
            return


def _fill_pass(root: Any, node: Any) -> bool:
    changed = False
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if value is None and "inherit" in f.metadata:
            source = get_by_path(root, f.metadata["inherit"])
            if source is not None:
                setattr(node, f.name, copy.deepcopy(source))
                changed = True
        elif dataclasses.is_dataclass(value):
            changed |= _fill_pass(root, value)
    return changed


def get_by_path(config: Any, key: str) -> Any:
    """The value at a dotted key of a config dataclass."""
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node
