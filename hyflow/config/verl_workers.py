"""verl's worker config classes (`verl.workers.config`), for code ported from verl that builds them.

    config = omega_conf_to_dataclass({"_target_": "hyflow.config.verl_workers.FSDPActorConfig", "strategy": "fsdp",
                                      "ppo_micro_batch_size_per_gpu": 8, "optim": {"lr": 1e-6}, "rollout_n": 4})
    config.validate(n_gpus=8, train_batch_size=256)

`ActorConfig` (`VerlActorConfig`) is hyflow's actor section (`hyflow.config.ActorConfig`) with verl's behaviour at
construction: values checked, the micro-batch size given once (globally or per device) unless batches are cut by
tokens, every field frozen but the batch sizes, dict-style access. `validate` applies hyflow's own batch-size rules
(`hyflow.config.checks`) to one section. hyflow's loader and workers read hyflow's sections, not these classes;
the engine-level ones (optimizer, engine, model) are in `hyflow.config.verl_engine`. hyflow does not train with
Megatron-Core: `McoreActorConfig` holds and checks values only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hyflow.config.actor_rollout_ref import ActorConfig as _HyflowActorConfig
from hyflow.config.actor_rollout_ref import PolicyLossConfig
from hyflow.config.base_config import BaseConfig
from hyflow.config.checks import _check_micro_batch, _check_mini_batch, _to_per_gpu
from hyflow.config.errors import ConfigError
from hyflow.config.targets import omega_conf_to_dataclass
from hyflow.config.verl_engine import (
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    HFModelConfig,
    McoreEngineConfig,
    McoreOptimizerConfig,
    OptimizerConfig,
    check_values,
)

__all__ = [
    "ActorConfig",
    "FSDPActorConfig",
    "FSDPEngineConfig",
    "FSDPOptimizerConfig",
    "HFModelConfig",
    "McoreActorConfig",
    "McoreEngineConfig",
    "McoreOptimizerConfig",
    "OptimizerConfig",
    "PolicyLossConfig",
    "VerlActorConfig",
    "omega_conf_to_dataclass",
]

_BATCH_SIZES = frozenset(
    {
        "ppo_mini_batch_size",
        "ppo_micro_batch_size",
        "ppo_micro_batch_size_per_gpu",
        "ppo_infer_micro_batch_size_per_gpu",
    }
)


@dataclass
class VerlActorConfig(_HyflowActorConfig, BaseConfig):
    """verl's actor section for any engine, `ActorConfig` under verl's name: hyflow's `ActorConfig` checked when
    built (see the module docstring)."""

    _mutable_fields = _BATCH_SIZES
    _section = "actor"

    strategy: Literal["fsdp", "fsdp2", "megatron"] = "fsdp"
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    data_loader_seed: int = 42

    def __post_init__(self) -> None:
        super().__post_init__()
        check_values(self)
        key = f"{self._section}.ppo_micro_batch_size"
        if not self.use_dynamic_bsz:
            problems: list[str] = []
            _to_per_gpu(problems, key, self.ppo_micro_batch_size, self.ppo_micro_batch_size_per_gpu, dp=1)
            if self.ppo_micro_batch_size is None and self.ppo_micro_batch_size_per_gpu is None:
                problems.append(
                    f"Please set at least one of {key} or {key}_per_gpu: verl's workers cut mini-batches by it. "
                    f"Fix: set {key}_per_gpu (the size on each device), or use_dynamic_bsz=True."
                )
            if problems:
                raise ConfigError(problems)
        self._freeze()

    def validate(self, n_gpus: int, train_batch_size: int, model_config: Mapping[str, Any] | None = None) -> None:
        """Check the batch sizes against `n_gpus` devices (one data-parallel rank per sequence-parallel group)
        and `train_batch_size` prompts per step, with hyflow's rules; raise `ConfigError` (a ValueError) listing
        every broken one. `model_config` is read by the engine-specific subclasses."""
        if self.use_dynamic_bsz:
            return
        n, dp = self.rollout_n or 1, max(n_gpus // self.ulysses_sequence_parallel_size, 1)
        problems = _check_mini_batch(self._section, self.ppo_mini_batch_size, train_batch_size, n, dp)
        key = f"{self._section}.ppo_micro_batch_size"
        per_gpu = _to_per_gpu(problems, key, self.ppo_micro_batch_size, self.ppo_micro_batch_size_per_gpu, dp)
        if not problems and per_gpu is not None:
            problems += _check_micro_batch(self._section, self.ppo_mini_batch_size, per_gpu, n, dp)
        if problems:
            raise ConfigError(problems)


ActorConfig = VerlActorConfig  # verl's name (hyflow's own section is hyflow.config.ActorConfig)


@dataclass
class FSDPActorConfig(VerlActorConfig):
    """verl's actor on its FSDP engine; `fsdp_config` is verl's `FSDPEngineConfig`, `optim` its
    `FSDPOptimizerConfig`. verl's Ulysses sequence parallelism needs padding-free batches."""

    strategy: Literal["fsdp", "fsdp2"] = "fsdp"
    optim: FSDPOptimizerConfig = field(default_factory=FSDPOptimizerConfig)
    fsdp_config: FSDPEngineConfig = field(default_factory=FSDPEngineConfig)
    use_remove_padding: bool = False

    def validate(self, n_gpus: int, train_batch_size: int, model_config: Mapping[str, Any] | None = None) -> None:
        """`ActorConfig.validate`, and with `ulysses_sequence_parallel_size > 1` the model's `use_remove_padding`
        (verl's sequence parallelism splits padding-free sequences; hyflow reads the size as data parallelism)."""
        super().validate(n_gpus, train_batch_size, model_config)
        remove_padding = (model_config or {}).get("use_remove_padding", self.use_remove_padding)
        if self.ulysses_sequence_parallel_size > 1 and not remove_padding:
            raise ValueError(
                f"{self._section}.ulysses_sequence_parallel_size={self.ulysses_sequence_parallel_size}: when using "
                "sequence parallelism for the actor or ref policy, you must enable `use_remove_padding`. "
                "Fix: set actor_rollout_ref.model.use_remove_padding=True, or ulysses_sequence_parallel_size=1."
            )


@dataclass
class McoreActorConfig(VerlActorConfig):
    """verl's actor on Megatron-Core (values only: hyflow does not train with Megatron-Core)."""

    strategy: Literal["megatron"] = "megatron"
    optim: McoreOptimizerConfig = field(default_factory=McoreOptimizerConfig)
    megatron: McoreEngineConfig = field(default_factory=McoreEngineConfig)
    load_weight: bool = True
