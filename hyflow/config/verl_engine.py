"""verl's engine-level config classes (`verl.workers.config.{optimizer,engine,model}`), for code ported from verl.

A verl worker builds these records itself (`FSDPOptimizerConfig(lr=1e-6)`, `FSDPEngineConfig(param_offload=True)`,
`HFModelConfig(path=...)`). Here each one is hyflow's own section with verl's extra fields and verl's behaviour at
construction: values checked (a wrong choice is a ValueError, a wrong type a TypeError), fields frozen except
verl's `_mutable_fields`, dict-style access (`BaseConfig`):

- `OptimizerConfig`, `FSDPOptimizerConfig` are hyflow's `OptimConfig` with `clip_grad` (hyflow keeps it as
  `actor.grad_clip`), `min_lr_ratio=None` meaning 0, and `warmup_style` read as `lr_scheduler_type`;
- `FSDPEngineConfig` is hyflow's `FSDPConfig`, its `wrap_policy` verl's free-form mapping;
- `HFModelConfig` is hyflow's `ModelConfig`, `target_modules` / `exclude_modules` / `experts_implementation` typed
  `Any` for OmegaConf and checked as hyflow's types;
- `McoreOptimizerConfig`, `McoreEngineConfig` are Megatron-Core's settings.

hyflow does not train with Megatron-Core: the `Mcore*` classes hold and check values only (for code that builds
them), and a run with `strategy=megatron` stops at config load (`hyflow.config.verl_compat`). hyflow's loader and
workers read hyflow's sections (`hyflow.config`), not these classes.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from hyflow.config.base_config import BaseConfig
from hyflow.config.common import FSDPConfig, ModelConfig, OptimConfig
from hyflow.config.convert import convert_value, describe_type

__all__ = [
    "FSDPEngineConfig",
    "FSDPOptimizerConfig",
    "HFModelConfig",
    "McoreEngineConfig",
    "McoreOptimizerConfig",
    "OptimizerConfig",
    "check_values",
]

logger = logging.getLogger(__name__)


def _choices(hint: Any) -> tuple[Any, ...]:
    """The allowed values of a Literal hint (also inside `X | None`); () for other hints."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    return tuple(choice for arg in typing.get_args(hint) for choice in _choices(arg))


def _as_lists(value: Any) -> Any:
    """Tuples as lists (the loader's form of a sequence), recursively."""
    if isinstance(value, list | tuple):
        return [_as_lists(item) for item in value]
    return value


def check_values(config: Any, checked_as: dict[str, Any] | None = None) -> None:
    """Check every field of a config dataclass against its type (or the type in `checked_as`) as hyflow's loader
    checks a command-line value, without its conversions (an int for a string). Raises ValueError for a value
    outside a field's choices, TypeError for one of the wrong type, naming the class, field, value and fix."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value, hint = getattr(config, f.name), (checked_as or {}).get(f.name, hints[f.name])
        if dataclasses.is_dataclass(value):
            continue  # a section: checked when it was built
        problems: list[str] = []
        converted = convert_value(value, hint, f.name, problems)
        if problems:
            choices = _choices(hint)
            error = ValueError if any(type(value) is type(choice) for choice in choices) else TypeError
            raise error(f"Invalid {f.name} for {type(config).__name__}: {problems[0]}")
        if converted != _as_lists(value):  # the command line's leniency (2024 -> "2024") is a wrong type here
            raise TypeError(
                f"Invalid {f.name} for {type(config).__name__}: {value!r} is not {describe_type(hint)}. "
                f"Fix: pass {f.name} as {describe_type(hint)}."
            )


_STEPS = frozenset({"clip_grad", "total_training_steps", "lr_warmup_steps", "lr_scheduler_type"})


@dataclass
class OptimizerConfig(OptimConfig, BaseConfig):
    """verl's optimizer base: hyflow's `OptimConfig` (AdamW, warmup, constant or cosine schedule) plus
    `clip_grad`, the gradient-norm bound verl keeps with the optimizer (`grad_clip` is its deprecated name)."""

    _mutable_fields = _STEPS

    clip_grad: float = 1.0
    grad_clip: float | None = None  # verl's deprecated spelling of clip_grad

    def __post_init__(self) -> None:
        check_values(self)
        if self.grad_clip is not None:
            logger.warning("OptimizerConfig: grad_clip is verl's deprecated name of clip_grad; reading it so.")
            object.__setattr__(self, "clip_grad", self.grad_clip)
        self._freeze()


@dataclass
class FSDPOptimizerConfig(OptimizerConfig):
    """verl's optimizer for its FSDP engine: which optimizer class (`optimizer` in `optimizer_impl`), the
    schedule (`warmup_style` is verl's older name of `lr_scheduler_type`), `min_lr_ratio=None` meaning 0."""

    optimizer: str = "AdamW"
    optimizer_impl: str = "torch.optim"
    min_lr_ratio: float | None = None
    warmup_style: Literal["constant", "cosine"] | None = None
    override_optimizer_config: dict[str, Any] | None = None
    zero_indexed_step: bool = True

    @property
    def effective_min_lr_ratio(self) -> float:
        """The final-lr fraction of the cosine schedule (None: 0, as verl)."""
        return 0.0 if self.min_lr_ratio is None else self.min_lr_ratio

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.warmup_style is not None:
            self.lr_scheduler_type = self.warmup_style  # mutable, as in verl


_MEGATRON_DTYPES = Literal["fp32", "float32", "32", "bf16", "bfloat16"]


@dataclass
class McoreOptimizerConfig(OptimizerConfig):
    """Megatron-Core's distributed optimizer (values only: hyflow does not train with Megatron-Core): Adam or
    Muon (`muon_*`, defaults as Megatron-Core's), its lr decay and its state dtypes."""

    optimizer: str = "adam"
    lr_warmup_init: float = 0.0
    lr_decay_steps: int | None = None
    lr_decay_style: str = "linear"
    min_lr: float = 0.0
    weight_decay_incr_style: str = "constant"
    use_checkpoint_opt_param_scheduler: bool = False
    use_precision_aware_optimizer: bool = False
    main_grads_dtype: _MEGATRON_DTYPES = "fp32"
    exp_avg_dtype: _MEGATRON_DTYPES = "fp32"
    exp_avg_sq_dtype: _MEGATRON_DTYPES = "fp32"
    use_layer_wise_distributed_optimizer: bool = False
    muon_momentum: float = 0.95
    muon_nesterov: bool = False
    muon_split_qkv: bool = True
    muon_scale_mode: str = "spectral"
    muon_coefficient_type: str = "quintic"
    muon_num_ns_steps: int = 5
    muon_tp_mode: str = "blockwise"
    muon_fp32_matmul_prec: str = "medium"
    muon_extra_scale_factor: float = 1.0
    muon_scalar_optimizer: str = "adam"
    override_optimizer_config: dict[str, Any] | None = None


_ENGINE_MUTABLE = frozenset({"param_offload", "use_dynamic_bsz", "micro_batch_size_per_gpu", "max_token_len_per_gpu"})


@dataclass
class FSDPEngineConfig(FSDPConfig, BaseConfig):
    """verl's FSDP engine settings: hyflow's `FSDPConfig` (offload, sharding size, dtypes) plus verl's engine
    fields. `wrap_policy` is verl's free-form mapping; hyflow's own `FSDPConfig.wrap_policy` is typed."""

    _mutable_fields = _ENGINE_MUTABLE | {"ulysses_sequence_parallel_size"}

    wrap_policy: dict[str, Any] = field(default_factory=dict)
    strategy: Literal["fsdp", "fsdp2"] = "fsdp"  # both are FSDP2 (`fully_shard`) in hyflow
    grad_offload: bool = False
    ulysses_sequence_parallel_size: int = 1
    use_dynamic_bsz: bool = True
    micro_batch_size_per_gpu: int | None = None
    max_token_len_per_gpu: int | None = None
    seed: int = 42

    def __post_init__(self) -> None:
        check_values(self)
        self._freeze()


@dataclass
class McoreEngineConfig(BaseConfig):
    """Megatron-Core's parallel layout and offload settings (values only: hyflow does not train with
    Megatron-Core). Sequence parallelism splits activations over the tensor-parallel group, so it is switched
    off when that group has one rank."""

    _mutable_fields = _ENGINE_MUTABLE | {"sequence_parallel"}

    strategy: Literal["megatron"] = "megatron"
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    sequence_parallel: bool = True
    use_distributed_optimizer: bool = True
    use_dist_checkpointing: bool = False
    dist_checkpointing_path: str | None = None
    use_dynamic_bsz: bool = True
    micro_batch_size_per_gpu: int | None = None
    max_token_len_per_gpu: int | None = None
    override_transformer_config: dict[str, Any] = field(default_factory=dict)
    seed: int = 42

    def __post_init__(self) -> None:
        check_values(self)
        sizes = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
        for name in (*sizes, "expert_model_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"McoreEngineConfig.{name}={getattr(self, name)} must be >= 1 (ranks per group).")
        if self.tensor_model_parallel_size == 1 and self.sequence_parallel:
            logger.info("McoreEngineConfig: sequence_parallel=False, as tensor_model_parallel_size is 1.")
            self.sequence_parallel = False
        self._freeze()


_MODEL_TYPES = typing.get_type_hints(ModelConfig)


@dataclass
class HFModelConfig(ModelConfig, BaseConfig):
    """verl's model section: hyflow's `ModelConfig` (a local Hugging Face folder, LoRA, gradient checkpointing).
    `target_modules` and `exclude_modules` accept a string or a list of strings; they are typed `Any` so that
    `OmegaConf.structured(HFModelConfig)` merges either, and checked as hyflow's types (or None) when built, as is
    `experts_implementation`.
    Unlike verl's, building it reads no files (hyflow loads the model and tokenizer in its workers)."""

    _mutable_fields = frozenset()

    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    experts_implementation: Any = "grouped_mm"  # a Literal, which OmegaConf cannot type

    def __post_init__(self) -> None:
        checked_as = {name: _MODEL_TYPES[name] | None for name in ("target_modules", "exclude_modules")}  # verl: None
        checked_as["experts_implementation"] = _MODEL_TYPES["experts_implementation"]
        check_values(self, checked_as)
        self._freeze()
