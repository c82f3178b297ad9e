"""Config pieces shared by several sections: model, FSDP, optimizer and checkpoint settings.

Key names and defaults follow verl's `ppo_trainer.yaml`, so a verl launch line such as
`actor_rollout_ref.actor.optim.lr=1e-6` or `critic.model.fsdp_config.param_offload=True` means the same here.
A field whose default is `None` and whose metadata names `inherit` takes the value of that other key at load time
(verl writes these as `${...}` interpolations); see `hyflow.config.convert.fill_inherited`. A field made with
`derived()` is computed by its own section's `__post_init__` when left `None`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

DType = Literal["fp32", "bf16", "fp16"]


def inherit(path: str) -> Any:
    """A field that defaults to the value of the config key `path` (dotted, from the root) when left `None`."""
    return field(default=None, metadata={"inherit": path})


def derived() -> Any:
    """A field that, when left `None`, its own section's `__post_init__` computes from sibling fields."""
    return field(default=None, metadata={"derived": True})


@dataclass
class WrapPolicyConfig:
    """Which modules FSDP2 shards on their own (`fully_shard` per module)."""

    min_num_params: int = 0
    transformer_layer_cls_to_wrap: list[str] | None = None  # None: the model's decoder-layer class


@dataclass
class MixedPrecisionConfig:
    """FSDP2 mixed precision: the dtype parameters are cast to for compute, and for gradient reduction."""

    param_dtype: DType = "bf16"
    reduce_dtype: DType = "fp32"
    buffer_dtype: DType = "fp32"


@dataclass
class FSDPConfig:
    """FSDP2 settings for one model (actor, ref, critic or reward model)."""

    param_offload: bool = False
    optimizer_offload: bool = False
    offload_policy: bool = False  # FSDP2 CPUOffloadPolicy: parameters live on CPU between uses
    reshard_after_forward: bool = True
    fsdp_size: int = -1  # -1: shard over all ranks
    forward_prefetch: bool = False
    model_dtype: DType = "fp32"  # dtype the master weights are loaded in
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)


@dataclass
class OptimConfig:
    """AdamW with linear warmup, then a constant or cosine schedule.

    `total_training_steps=-1` is filled in by the trainer from the data size and `trainer.total_epochs`.
    Warmup lasts `lr_warmup_steps` steps, or `lr_warmup_steps_ratio * total_training_steps` when it is -1.
    verl's older name `warmup_style` is read as `lr_scheduler_type`.
    """

    lr: float = 1e-6
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.01
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = 0.0  # cosine: the final lr is lr * min_lr_ratio
    num_cycles: float = 0.5  # cosine: half a cosine wave by default
    total_training_steps: int = -1

    @property
    def warmup_style(self) -> str:
        """verl's older name for `lr_scheduler_type`."""
        return self.lr_scheduler_type


CheckpointContent = Literal["model", "optimizer", "extra", "hf_model"]


@dataclass
class CheckpointConfig:
    """What a checkpoint holds: FSDP model shards, optimizer state, extra (lr scheduler, RNG), a Hugging Face copy."""

    save_contents: list[CheckpointContent] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    load_contents: list[CheckpointContent] = field(default_factory=lambda: ["model", "optimizer", "extra"])


@dataclass
class ModelConfig:
    """A Hugging Face model loaded from a local folder (`path`), with optional LoRA through `peft`.

    `path=None` means hyflow's built-in tiny demo model (see `hyflow demo`).
    """

    path: str | None = None
    tokenizer_path: str | None = None  # None: the tokenizer saved next to the model (`path`)
    custom_chat_template: str | None = None
    external_lib: str | None = None  # a module imported before loading (registers custom architectures)
    override_config: dict[str, Any] = field(default_factory=dict)  # applied to the HF config before loading
    trust_remote_code: bool = False
    enable_gradient_checkpointing: bool = True
    use_fused_kernels: bool = True
    use_remove_padding: bool = False
    # mixture-of-experts models: how transformers computes the experts (grouped_mm: one grouped GEMM per
    # projection over all experts; batched_mm: a batched matmul over gathered expert weights; eager: a Python loop
    # over the experts, the reference)
    experts_implementation: Literal["grouped_mm", "batched_mm", "eager"] = "grouped_mm"
    lora_rank: int = 0  # 0: full fine-tuning
    lora_alpha: int = 16
    target_modules: str | list[str] = "all-linear"
    exclude_modules: str | list[str] | None = None
    # a saved peft adapter folder to continue training from (verl's key); its adapter_config.json then supplies
    # lora_rank, lora_alpha, target_modules and exclude_modules
    lora_adapter_path: str | None = None
