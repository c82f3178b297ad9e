"""Load and check a `PPOTrainerConfig` from command-line overrides, a DictConfig or a dict.

    from hyflow.config import load_config, check_config
    config = load_config(["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "algorithm.adv_estimator=grpo"])
    config = check_config(PPOTrainerConfig(...))        # a config built in Python

One straight line, each step once:

1. `parse_overrides`: each `key=value` string through Hydra's override grammar (lists `[a,b]`, `+key`, `~key`,
   quoting). A `~` that starts a path is the home folder, as a shell would have made it.
2. `apply_overrides`: onto the dataclass defaults (`default_dict`), each key resolved first (verl spellings read
   as hyflow's, no-op verl keys dropped with a notice, typos get the closest valid key).
3. `to_dataclass`: every value against its type and choices.
4. `finalize` (`hyflow.config.checks`): the values derived from others, and the cross-field checks.

Nothing stops at the first mistake: every problem of every step is reported in one `ConfigError`.
"""

from __future__ import annotations

import copy
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hyflow.config.checks import finalize
from hyflow.config.convert import default_dict, resolve_key, to_dataclass, to_plain_dict
from hyflow.config.errors import ConfigError
from hyflow.config.ppo_trainer import PPOTrainerConfig

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

logger = logging.getLogger(__name__)

# A `~` at the start of a value or of a list item, followed by `/` or the end of that item.
_HOME_PREFIX = re.compile(r"(?P<lead>^|[\[,]\s*)~(?=/|$|\s*[,\]])")
_QUOTE_WORTHY = "~=[]{}(),'\"\\ :$"


def load_config(
    overrides: Sequence[str | Override] | DictConfig | Mapping[str, Any] | None = None, check_files: bool = True
) -> PPOTrainerConfig:
    """The checked, typed config: the defaults + `overrides` (`key=value` strings in Hydra's syntax, or what
    `parse_overrides` made of them), or a whole config as a DictConfig / nested dict. `check_files=False` skips
    the checks that the model folders and data files exist (to check a launch line meant for another machine)."""
    problems: list[str] = []
    if isinstance(overrides, DictConfig | Mapping):
        data = _resolved(_container(overrides), problems)
    elif overrides is None or (isinstance(overrides, Sequence) and not isinstance(overrides, str)):
        items = list(overrides or [])
        parsed = [item for item in items if not isinstance(item, str)]
        parsed += parse_overrides([item for item in items if isinstance(item, str)], problems)
        data = apply_overrides(default_dict(), parsed, problems)
    else:
        raise TypeError(f"load_config takes a list of 'key=value' strings or a DictConfig, got {type(overrides)}")
    data.pop("hydra", None)
    invalid_keys: set[str] = set()
    config = to_dataclass(PPOTrainerConfig, data, "", problems, invalid_keys)
    found = finalize(config, check_files=check_files)
    problems += [problem for problem in found if not _mentions_any(problem, invalid_keys)]
    if problems:
        raise ConfigError(problems)
    return config


def check_config(config: PPOTrainerConfig, check_files: bool = True) -> PPOTrainerConfig:
    """Check a config built in Python (types, choices, cross-field rules, files); return a finalized copy."""
    return load_config(to_plain_dict(config), check_files=check_files)


def _mentions_any(problem: str, keys: set[str]) -> bool:
    """Whether a cross-field problem is about a key whose own value was already rejected (it was checked with
    that key's default, so its message would be about a value the user never set)."""
    return any(key in problem or key.split(".", 1)[-1] in problem for key in keys)


# ---------------------------------------------------------------------------------------------- step 1: parse


def parse_overrides(overrides: Sequence[str], problems: list[str] | None = None) -> list[Override]:
    """Each override through Hydra's grammar, once. A malformed one is reported (in `problems`, or raised as a
    ConfigError when no list is given) with what Hydra rejected and how to quote it; the others are parsed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    found: list[str] = []
    parsed: list[Override] = []
    for line in overrides:
        try:
            parsed.extend(parser.parse_overrides([expand_home(line)]))
        except OverrideParseException as err:
            found.append(parse_error_message(line, err))
    if found and problems is None:
        raise ConfigError(found)
    if problems is not None:
        problems.extend(found)
    return parsed


def expand_home(line: str) -> str:
    """`key=~/x` (and `key=[~/a,~/b]`) with `~` replaced by the home folder; the key part and quoted values are left
    alone (quoted paths are expanded later with every other path field, by `finalize`)."""
    key, sep, value = line.partition("=")
    if not sep or value.startswith(("'", '"')):
        return line
    home = os.path.expanduser("~")
    return key + sep + _HOME_PREFIX.sub(lambda m: m.group("lead") + home, value)


def parse_error_message(line: str, err: Exception) -> str:
    """What Hydra rejected in `line`, in one sentence, and the fix."""
    details = [part.strip() for part in str(err).splitlines()]
    reason = next(
        (
            part
            for part in details
            if part and not part.startswith(("Error parsing override", "See https://")) and set(part) != {"^"}
        ),
        "not a key=value override",
    )
    reason = reason.removeprefix("LexerNoViableAltException: ").strip()
    if reason == line.strip():
        reason = "a character the grammar does not allow there"
    key, sep, value = line.partition("=")
    if not sep:
        return f"could not parse `{line}`: it has no `=`. Fix: write each override as key=value."
    special = sorted({ch for ch in value if ch in _QUOTE_WORTHY})
    shown = " ".join(repr(ch) for ch in special) or "nothing unusual"
    quoted = f"{key}='{value}'" if "'" not in value else f'{key}="{value}"'
    return (
        f"could not parse `{line}`: Hydra's override grammar rejects it ({reason}); the value holds {shown}. "
        f"Fix: quote the value, e.g. {quoted} (inside quotes ~ = [ ] , and spaces are plain text), or write a "
        "list as key=[a,b]."
    )


# ---------------------------------------------------------------------------------------------- step 2: apply


def apply_overrides(base: dict[str, Any], parsed: Sequence[Override], problems: list[str]) -> dict[str, Any]:
    """`base` with the parsed overrides applied (Hydra's meaning: `key=v` sets, `+key=v` / `++key=v` add, `~key`
    deletes), each key resolved first; an override that cannot apply becomes a message in `problems`."""
    cfg = OmegaConf.create(base)
    for override in parsed:
        line, key = override.input_line, override.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            logger.warning("config: ignoring `%s`: hyflow reads the command line itself, without a Hydra app.", line)
            continue
        if override.is_sweep_override():
            problems.append(f"`{line}` is a sweep (several values); hyflow runs one config. Fix: run once per value.")
            continue
        value = None if override.is_delete() else override.value()
        status = resolve_key(key, value)
        if status.kind == "ignored":
            logger.warning(status.message)
        elif status.kind == "invalid":
            problems.append(f"{status.message} (from `{line}`)")
        elif override.is_delete():
            _delete(cfg, status.key)
        else:
            try:
                OmegaConf.update(cfg, status.key, value, merge=True, force_add=True)
            except OmegaConfBaseException as err:
                problems.append(f"`{line}` cannot be applied: {err}. Fix: set {status.key} to a plain value.")
    return _resolved(OmegaConf.to_container(cfg, resolve=False), problems)  # type: ignore[arg-type]


def _delete(cfg: DictConfig, key: str) -> None:
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if isinstance(parent, DictConfig) and leaf in parent:
        del parent[leaf]


def _container(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]
    return copy.deepcopy(dict(cfg))


def _resolved(raw: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """`raw` with the user's `${...}` interpolations resolved (the defaults hold none)."""
    try:
        return OmegaConf.to_container(OmegaConf.create(raw), resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as err:  # an interpolation such as ${data.missing} that does not resolve
        problems.append(f"could not resolve an interpolation: {err}. Fix: point the ${{...}} at a set key.")
        return raw
