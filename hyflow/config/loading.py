"""Load and check a `PPOTrainerConfig` from command-line overrides, a DictConfig or a dict.

    from hyflow.config import load_config, validate_config
    config = load_config(["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "algorithm.adv_estimator=grpo"])
    config = validate_config(PPOTrainerConfig(...))        # a config built in Python

Both raise one `ConfigError` listing every problem. `prepare_overrides` is the command-line half that runs before
Hydra composes the config (so unknown keys get hyflow's message, with a suggestion, instead of Hydra's);
`register_with_hydra` stores the defaults as Hydra's `ppo_trainer` config.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hyflow.config.convert import (
    all_keys,
    clear_default_interpolations,
    default_dict,
    resolve_key,
    to_dataclass,
    to_plain_dict,
)
from hyflow.config.errors import ConfigError
from hyflow.config.ppo_trainer import PPOTrainerConfig
from hyflow.config.validation import finalize

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

logger = logging.getLogger(__name__)

CONFIG_NAME = "ppo_trainer"


def load_config(overrides: Sequence[str] | DictConfig | Mapping[str, Any] | None = None) -> PPOTrainerConfig:
    """The checked, typed config: defaults + `overrides` (a list of `key=value` strings in Hydra syntax, or a
    composed DictConfig / dict such as the one a Hydra app receives)."""
    if isinstance(overrides, DictConfig | Mapping):
        data = _to_container(overrides)
    elif overrides is None or (isinstance(overrides, Sequence) and not isinstance(overrides, str)):
        data = apply_overrides(default_dict(), list(overrides or []))
    else:
        raise TypeError(f"load_config takes a list of 'key=value' strings or a DictConfig, got {type(overrides)}")
    data.pop("hydra", None)
    problems: list[str] = []
    config = to_dataclass(PPOTrainerConfig, data, "", problems)
    if problems:
        raise ConfigError(problems)
    problems = finalize(config)
    if problems:
        raise ConfigError(problems)
    return config


def validate_config(config: PPOTrainerConfig) -> PPOTrainerConfig:
    """Check a config built in Python (types, choices, cross-field rules); return a normalised copy."""
    return load_config(to_plain_dict(config))


def _to_container(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    raw = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else copy.deepcopy(dict(cfg))
    clear_default_interpolations(raw)
    try:
        return OmegaConf.to_container(OmegaConf.create(raw), resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as err:  # an interpolation such as ${data.missing} that does not resolve
        message = f"could not resolve an interpolation: {err}. Fix: point the ${{...}} at a valid key."
        raise ConfigError([message]) from err


def prepare_overrides(overrides: Sequence[str]) -> list[str]:
    """Check command-line overrides against the schema and rewrite them so Hydra can apply them.

    verl spellings become hyflow's keys; no-op verl keys are dropped with a notice; `+key=value` on a key that
    exists becomes `++key=value` (verl scripts add keys their YAML lacked); `hydra.*` passes through. Unknown
    and unsupported keys raise one ConfigError naming them all.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as err:
        raise ConfigError([f"could not parse the command line: {err}. Fix: write each override as key=value."]) from err
    problems: list[str] = []
    prepared: list[str] = []
    for override in parsed:
        line = override.input_line or ""
        if _is_hydra_setting(override.key_or_group):
            prepared.append(line)
            continue
        value = None if override.is_delete() or override.is_sweep_override() else override.value()
        status = resolve_key(override.key_or_group, value)
        if status.kind == "ignored":
            logger.warning(status.message)
        elif status.kind == "invalid":
            problems.append(f"{status.message} (from `{line}`)")
        else:
            prepared.append(_rewrite(line, status.key, override))
    if problems:
        raise ConfigError(problems)
    return prepared


def _is_hydra_setting(key: str) -> bool:
    """Hydra's own settings (`hydra.run.dir=...`) and config groups (`hydra/job_logging=none`)."""
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def _rewrite(line: str, key: str, override: Override) -> str:
    """The override on hyflow's key; `++` (set, adding if absent) for `+key` and keys inside free-form mappings."""
    value = line.split("=", 1)[1] if "=" in line else None
    if override.is_delete():
        return f"~{key}" if value is None else f"~{key}={value}"
    force = override.is_add() or override.is_force_add() or key not in all_keys()
    return f"{'++' if force else ''}{key}={value}"


def apply_overrides(base: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`base` with command-line overrides applied the way Hydra applies them (after `prepare_overrides`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg = OmegaConf.create(base)
    for override in OverridesParser.create().parse_overrides(prepare_overrides(overrides)):
        key = override.key_or_group
        if _is_hydra_setting(key):
            continue
        if override.is_sweep_override():
            raise ConfigError([f"`{override.input_line}` is a sweep; sweeps need `--multirun` on the command line."])
        if override.is_delete():
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
            if isinstance(parent, DictConfig) and leaf in parent:
                del parent[leaf]
            continue
        OmegaConf.update(cfg, key, override.value(), merge=True, force_add=True)
    return _to_container(cfg)


def register_with_hydra() -> None:
    """Store the dataclass defaults (as a plain dict, so hyflow, not OmegaConf, checks types) under the name
    `ppo_trainer` in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    node = OmegaConf.create({"defaults": _HYDRA_DEFAULTS, **default_dict(), "hydra": {"help": _HELP, **_HYDRA_RUN}})
    ConfigStore.instance().store(name=CONFIG_NAME, node=node)


# Hydra writes nothing to the working folder: no `outputs/<date>/<time>/` with a copy of the config and a log file
# (hyflow's own loggers write under `logs/<project>/<experiment>`, checkpoints under `trainer.default_local_dir`).
_HYDRA_DEFAULTS = ["_self_", {"override hydra/job_logging": "stdout"}]
_HYDRA_RUN = {"run": {"dir": "."}, "output_subdir": None, "job": {"chdir": False}}


_HELP = {
    "app_name": "hyflow train",
    "header": "hyflow train (same as python -m hyflow.trainer.main_ppo): PPO/GRPO post-training with verl's "
    "config keys.\n\nUsage: hyflow train key=value ...\n  e.g. hyflow train data.train_files=train.parquet "
    "actor_rollout_ref.model.path=/models/qwen algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=5\n",
    "footer": "Every key is checked before any worker starts (unknown keys, types, choices, batch-size rules).\n"
    "Every key with its default: hyflow train --cfg job (add overrides to see their effect), or the reference,\n"
    "docs/configuration.md. Hydra's own options: --hydra-help.",
    "template": "${hydra.help.header}\n${hydra.help.footer}\n",
}
