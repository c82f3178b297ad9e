"""Building a role's training pieces from its config: model (LoRA, gradient checkpointing, FSDP2, loaded lean
over several ranks: `lean_load`), optimizer,
schedule, per-rank batch sizes, and the Hugging Face assets a checkpoint carries. Shared by the actor/ref and
critic workers so both build the same way.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from typing import Any

from torch import nn

from hyflow.models.kernels import apply_fused_kernels
from hyflow.models.loader import check_local_model_folder, load_causal_lm, load_tokenizer, value_model_of
from hyflow.models.lora import adapter_settings, apply_lora, load_lora_adapter
from hyflow.models.multimodal import freeze_vision_tower, is_vision_language
from hyflow.models.policy import PolicyModel
from hyflow.models.processor import copy_processor_files
from hyflow.models.value_head import ValueModel
from hyflow.workers.fsdp import to_dtype, training_device
from hyflow.workers.lean_load import build_sharded
from hyflow.workers.optim import build_lr_scheduler, build_optimizer

logger = logging.getLogger(__name__)


def model_path(model_config: Any, section: str) -> str:
    """The checked local folder of `model_config.path` (`section` names the model's config section, e.g.
    `actor_rollout_ref.model`); `None` is an error naming the key."""
    key = f"{section}.path"
    if model_config.path is None:
        raise ValueError(
            f"{key}=None: set it to a local Hugging Face model folder (or run `hyflow train` without a model and "
            "data for the embedded default, or `hyflow demo`, which builds a tiny one)."
        )
    return check_local_model_folder(model_config.path, key)


def import_external_lib(model_config: Any) -> None:
    """Import `model.external_lib` (a module that registers custom architectures with transformers)."""
    if model_config.external_lib:
        importlib.import_module(model_config.external_lib)


def tokenizer_for(model_config: Any, path: str, section: str):
    """The tokenizer at `tokenizer_path`, else the one saved next to the model at `path`; a problem is reported
    under the key the folder came from."""
    if model_config.tokenizer_path:
        tokenizer_path, key = model_config.tokenizer_path, f"{section}.tokenizer_path"
    else:
        tokenizer_path, key = path, f"{section}.path"
    return load_tokenizer(tokenizer_path, trust_remote_code=model_config.trust_remote_code, key=key)


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant; transformers 4.x and 5.x names)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 renamed it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def use_fused_kernels(model_config: Any) -> bool:
    """`model.use_fused_kernels` and this process trains on CUDA (on CPU every op runs its torch reference)."""
    return bool(model_config.use_fused_kernels) and training_device().type == "cuda"


def apply_fused_kernels_if_enabled(model: nn.Module, model_config: Any) -> int:
    """Patch the model's RMSNorm, MLP and attention modules with the fused kernels when `use_fused_kernels`
    applies; returns how many modules were patched (0 when it does not apply). Call it before LoRA and FSDP2."""
    return apply_fused_kernels(model) if use_fused_kernels(model_config) else 0


def policy_maker(model_config: Any, fsdp_config: Any, path: str, trainable: bool, freeze_vision: bool = False):
    """`make(empty_weights) -> (PolicyModel, the causal LM)` for `lean_load.build_sharded`: load the causal LM
    (master dtype `fsdp_config.model_dtype`; with `empty_weights` its parameters on meta), patch in the fused
    kernels (CUDA), add LoRA and gradient checkpointing when training, and wrap it as a `PolicyModel`. A frozen
    policy (the ref) has no grads; `freeze_vision` (`actor.freeze_vision_tower`) freezes a VLM's vision encoder."""
    dtype = to_dtype(fsdp_config.model_dtype, "fsdp_config.model_dtype")

    def make(empty_weights: bool) -> tuple[PolicyModel, nn.Module]:
        lm = load_causal_lm(
            path,
            dtype,
            model_config.override_config,
            model_config.trust_remote_code,
            empty_weights=empty_weights,
            experts_implementation=model_config.experts_implementation,
        )
        hf_model = lm
        if freeze_vision:
            if not is_vision_language(lm.config):
                raise ValueError(
                    f"actor_rollout_ref.actor.freeze_vision_tower=True, but {path!r} is a text-only model (its "
                    "config has no vision_config); set it to False or point model.path at a vision-language model."
                )
            freeze_vision_tower(lm)
        apply_fused_kernels_if_enabled(lm, model_config)
        if trainable and model_config.enable_gradient_checkpointing:
            enable_gradient_checkpointing(lm)
        if trainable and model_config.lora_adapter_path:
            lm = load_lora_adapter(lm, model_config.lora_adapter_path)
        elif trainable and model_config.lora_rank > 0:
            lm = apply_lora(
                lm,
                model_config.lora_rank,
                model_config.lora_alpha,
                model_config.target_modules,
                model_config.exclude_modules,
            )
        if not trainable:
            lm.requires_grad_(False)
            lm.eval()
        policy = PolicyModel(
            lm, use_fused_kernels=use_fused_kernels(model_config), remove_padding=model_config.use_remove_padding
        )
        return policy, hf_model

    return make


def build_policy(
    model_config: Any, fsdp_config: Any, mesh: Any, path: str, trainable: bool, freeze_vision: bool = False
) -> PolicyModel:
    """The policy of `policy_maker`, sharded with FSDP2; over several ranks each reads only its own shards of the
    checkpoint (`lean_load`)."""
    make = policy_maker(model_config, fsdp_config, path, trainable, freeze_vision)
    return build_sharded(make, path, fsdp_config, mesh)[0]


def value_model_maker(model_config: Any, fsdp_config: Any, path: str):
    """`make(empty_weights) -> (ValueModel, its causal LM)` for `lean_load.build_sharded`: the critic of
    `load_value_model` (master dtype `fsdp_config.model_dtype`), with the fused kernels (CUDA), remove-padding
    and gradient checkpointing as `critic.model` sets them."""
    dtype = to_dtype(fsdp_config.model_dtype, "critic.model.fsdp_config.model_dtype")

    def make(empty_weights: bool) -> tuple[ValueModel, nn.Module]:
        lm = load_causal_lm(
            path,
            dtype,
            model_config.override_config,
            model_config.trust_remote_code,
            key="critic.model.path",
            empty_weights=empty_weights,
            experts_implementation=model_config.experts_implementation,
        )
        model = value_model_of(lm, dtype, path)
        apply_fused_kernels_if_enabled(model.backbone, model_config)
        if model_config.use_remove_padding:
            model.enable_remove_padding()
        if model_config.enable_gradient_checkpointing:
            enable_gradient_checkpointing(model.backbone)
        return model, lm

    return make


def build_value_model(model_config: Any, fsdp_config: Any, mesh: Any, path: str) -> ValueModel:
    """The critic of `value_model_maker`, sharded with FSDP2 (lean over several ranks, as `build_policy`)."""
    make = value_model_maker(model_config, fsdp_config, path)
    return build_sharded(make, path, fsdp_config, mesh, key="critic.model.fsdp_config")[0]


def build_optimizer_and_scheduler(module: nn.Module, optim_config: Any):
    optimizer = build_optimizer(module.parameters(), optim_config)
    return optimizer, build_lr_scheduler(optimizer, optim_config)


def rows_per_rank(prompts: int, samples_per_prompt: int, world_size: int, key: str) -> int:
    """verl's mini-batch arithmetic: `prompts × rollout.n` rows, split evenly over the data-parallel ranks."""
    rows = prompts * samples_per_prompt
    if rows % world_size:
        raise ValueError(
            f"{key}={prompts} × rollout.n={samples_per_prompt} = {rows} rows cannot be split evenly over "
            f"{world_size} ranks; choose {key} so that {key} × rollout.n is a multiple of the number of devices."
        )
    return rows // world_size


def hf_assets_saver(hf_config: Any, tokenizer: Any, generation_config: Any = None, model_folder: str | None = None):
    """A function that writes the model's config, generation config and tokenizer into `huggingface/`, and a
    vision-language model's processor files (copied from `model_folder`, the folder it was loaded from)."""

    def save(folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        hf_config.save_pretrained(folder)
        if generation_config is not None:
            generation_config.save_pretrained(folder)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        if model_folder is not None:
            copy_processor_files(model_folder, folder)

    return save


def with_adapter_settings(model_config: Any) -> Any:
    """`model_config` with lora_rank / lora_alpha / target_modules / exclude_modules read from its saved adapter
    (`lora_adapter_path`, as verl does), or unchanged without one."""
    if not model_config.lora_adapter_path:
        return model_config
    settings = adapter_settings(model_config.lora_adapter_path)
    logger.info("LoRA from the adapter at %s: %s", model_config.lora_adapter_path, settings)
    return dataclasses.replace(model_config, **settings)


def lora_info(model_config: Any) -> dict[str, Any] | None:
    """What `hyflow merge` needs to rebuild the LoRA-wrapped model (None without LoRA)."""
    if model_config.lora_rank <= 0:
        return None
    return {
        "rank": model_config.lora_rank,
        "alpha": model_config.lora_alpha,
        "target_modules": model_config.target_modules,
        "exclude_modules": model_config.exclude_modules,
    }
