"""The SFT trainer's config (`hyflow sft key=value ...`), with key names close to verl's `sft_trainer.yaml`.

    from hyflow.config.sft import load_sft_config
    config = load_sft_config(["data.train_files=train.parquet", "model.path=/models/tiny", "optim.lr=1e-4"])

Sections: `data` (chat parquet, lengths, batch sizes), `model` (the shared `ModelConfig` plus its `fsdp_config`),
`optim` (AdamW and schedule, plus `clip_grad`), `checkpoint` (what a checkpoint holds) and `trainer` (loop length,
cadence, logging, output folder). Overrides use the same `key=value` syntax as `hyflow train`; unknown keys, wrong
types and values outside their choices are collected into one `ConfigError` before any model is loaded.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hyflow.config.common import CheckpointConfig, FSDPConfig, ModelConfig, OptimConfig, derived
from hyflow.config.errors import ConfigError
from hyflow.config.trainer import LoggerName

SFTTruncation = Literal["error", "left", "right"]


@dataclass
class SFTDataConfig:
    """Chat conversations to imitate; the loss covers the assistant turns only.

    A row holds `messages_key` (a list of chat messages, optionally with a `tools` column). With `response_key`
    set (a dotted path such as `extra_info.answer`), a row of the RL schema works too: its `prompt_key` messages
    followed by one assistant turn holding that response.
    """

    train_files: str | list[str] | None = None
    val_files: str | list[str] | None = None
    messages_key: str = "messages"
    tools_key: str = "tools"
    prompt_key: str = "prompt"  # used with response_key only
    response_key: str | None = None  # e.g. "extra_info.answer"; None: read messages_key
    max_length: int = 1024  # tokens per conversation, template included
    truncation: SFTTruncation = "error"  # left keeps the end, right keeps the start
    train_batch_size: int = 256  # conversations per optimizer step, over all ranks
    micro_batch_size_per_gpu: int = 4  # conversations per forward/backward on one rank
    shuffle: bool = True
    train_max_samples: int = -1  # -1: all rows
    val_max_samples: int = -1
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    image_key: str = "images"  # vision-language models: each row's images (verl's schema, "<image>" in messages)
    video_key: str = "videos"  # column of each row's videos (see hyflow.data.video)


@dataclass
class SFTModelConfig(ModelConfig):
    """The model to fine-tune (a local Hugging Face folder), with LoRA and FSDP2 settings."""

    enable_gradient_checkpointing: bool = False
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class SFTOptimConfig(OptimConfig):
    """AdamW for SFT: verl's SFT defaults (lr 1e-5, 10% warmup, cosine decay) and the gradient-norm clip."""

    lr: float = 1e-5
    lr_warmup_steps_ratio: float = 0.1
    lr_scheduler_type: Literal["constant", "cosine"] = "cosine"
    clip_grad: float = 1.0


@dataclass
class SFTRunConfig:
    """The loop: its length, when to validate and save, where the output goes, and the loggers."""

    project_name: str = "hyflow-sft"
    experiment_name: str = "default"
    total_epochs: int = 1
    total_training_steps: int | None = None  # None: total_epochs × steps per epoch
    logger: list[LoggerName] = field(default_factory=lambda: ["console"])
    log_dir: str | None = None  # None: logs/{project_name}/{experiment_name}
    test_freq: int = -1  # validation loss every N steps (and at the end); -1: only at the end
    # checkpoint every N steps and at the end; -1 (the default, as verl's SFT): only at the end; 0: never (unlike
    # `hyflow train`, where -1 saves nothing)
    save_freq: int = -1
    max_ckpt_to_keep: int | None = None  # None: keep all
    default_local_dir: str | None = derived()  # None: checkpoints/{project_name}/{experiment_name}
    resume_mode: Literal["auto", "disable", "resume_path"] = "auto"  # auto: the latest checkpoint, if any
    resume_from_path: str | None = None  # a global_step_N folder, with resume_mode=resume_path
    save_hf_model: bool = True  # write {default_local_dir}/huggingface at the end (model.path for PPO)
    device: Literal["auto", "cuda", "cpu"] = "auto"
    seed: int = 1

    def __post_init__(self) -> None:
        if self.default_local_dir is None:
            self.default_local_dir = f"checkpoints/{self.project_name}/{self.experiment_name}"


@dataclass
class SFTConfig:
    """Root of the SFT config."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    trainer: SFTRunConfig = field(default_factory=SFTRunConfig)


def sft_default_dict() -> dict[str, Any]:
    """The defaults as a plain nested dict (what `--cfg` prints and overrides are applied to)."""
    from hyflow.config.convert import default_dict

    return default_dict(SFTConfig)


def load_sft_config(overrides: Sequence[str] = ()) -> SFTConfig:
    """The checked SFT config: defaults plus `key=value` overrides in Hydra's syntax (lists as `[a,b]`)."""
    from omegaconf import OmegaConf

    from hyflow.config.convert import to_dataclass
    from hyflow.config.files import expand_user_paths
    from hyflow.config.loading import parse_overrides

    problems: list[str] = []
    parsed = parse_overrides(list(overrides), problems)  # `~/x` is the home folder, as for `hyflow train`
    cfg = OmegaConf.create(sft_default_dict())
    for override in parsed:
        if override.is_delete() or override.is_sweep_override():
            problems.append(f"`{override.input_line}`: hyflow sft takes plain key=value overrides only.")
        elif problem := _check_key(override.key_or_group):
            problems.append(problem)
        else:
            OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True, force_add=True)
    config = to_dataclass(SFTConfig, OmegaConf.to_container(cfg, resolve=True), "", problems)
    expand_user_paths(config)
    problems.extend(check_sft_config(config))
    if problems:
        raise ConfigError(problems)
    return config


def _check_key(key: str) -> str | None:
    """None for a key of the SFT schema (or inside one of its free-form mappings), else the message."""
    from hyflow.config.convert import all_keys

    keys = all_keys(SFTConfig)
    mappings = ("data.apply_chat_template_kwargs.", "model.override_config.")
    if key in keys or key.startswith(mappings):
        return None
    leaves = [k for k in keys if not any(other.startswith(k + ".") for other in keys)]
    close = difflib.get_close_matches(key, leaves, n=1, cutoff=0.6)
    hint = f"Did you mean {close[0]!r}?" if close else "See `hyflow sft --help` for every key."
    return f"unknown key {key!r}: it is not an SFT config key. {hint} Fix: correct or remove it."


def check_sft_config(config: SFTConfig) -> list[str]:
    """Cross-field rules that do not depend on the number of ranks (the trainer checks those)."""
    data, problems = config.data, []
    for key in ("max_length", "train_batch_size", "micro_batch_size_per_gpu"):
        value = getattr(data, key)
        if isinstance(value, int) and value < 1:
            problems.append(f"data.{key}={value} must be >= 1. Fix: set data.{key} to a positive number.")
    if config.trainer.total_epochs < 1:
        problems.append(f"trainer.total_epochs={config.trainer.total_epochs} must be >= 1.")
    if config.optim.clip_grad <= 0:
        problems.append(f"optim.clip_grad={config.optim.clip_grad} must be > 0 (the max gradient norm), e.g. 1.0.")
    return problems
