"""LoRA through `peft`: wrap a causal LM with adapters, and fold adapters back into plain weights.

    lm = apply_lora(lm, lora_rank=8, lora_alpha=16, target_modules="all-linear")   # only adapters train
    lm = load_lora_adapter(lm, "saved/adapter")        # continue from a saved adapter (model.lora_adapter_path)
    with lm.disable_adapter(): ...                                                # the reference policy
    for name, tensor in merged_hf_weights(policy_named_tensors, scaling=16 / 8): ...   # W + s·B·A, HF names

LoRA (Hu et al. 2021, arXiv:2106.09685): a frozen weight W (out, in) gets a trainable low-rank update,
W' = W + (α / r) · B · A, with A (r, in) and B (out, r); B starts at zero so training starts from the base model.

On a lean-loading skeleton (base weights on `meta`, `hyflow.workers.lean_load`) the adapters are created on the CPU
in the base weights' dtype, with peft's initialisation (the same random draws as on a loaded model), where peft
would move them to meta and lose their values.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

ADAPTER = "default"
_LORA_PIECE = re.compile(r"^(?P<module>.+)\.(?P<piece>base_layer|lora_A\.\w+|lora_B\.\w+)\.(?P<param>weight|bias)$")
_PREFIXES = ("lm.", "base_model.model.")


@contextlib.contextmanager
def _stand_ins_for_meta(model: nn.Module) -> Iterator[None]:
    """peft puts each adapter on its base weight's device; on a skeleton that is `meta`, where the adapter's
    initial (or loaded) values are lost. Inside the block every meta parameter of `model` is a CPU stand-in of its
    shape and dtype that holds one element (`expand`), so peft creates the adapters on the CPU with its usual random
    draws; afterwards the meta parameters are back (tied ones tied again), with peft's `requires_grad`."""
    swapped = []
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None and param.device.type == "meta":
                stand_in = torch.zeros((), dtype=param.dtype).expand(param.shape)
                module._parameters[name] = nn.Parameter(stand_in, requires_grad=param.requires_grad)
                swapped.append((module, name, param))
    try:
        yield
    finally:
        for module, name, param in swapped:
            param.requires_grad_(module._parameters[name].requires_grad)
            module._parameters[name] = param


def apply_lora(
    lm: nn.Module,
    lora_rank: int,
    lora_alpha: int,
    target_modules: str | list[str] = "all-linear",
    exclude_modules: str | list[str] | None = None,
) -> nn.Module:
    """Wrap `lm` in a `peft` LoRA model (adapter "default"); base weights are frozen. On a mixture-of-experts model
    "all-linear" means its `nn.Linear` layers (attention, a shared expert), not its routers and 3D experts."""
    from peft import LoraConfig, get_peft_model

    if lora_rank <= 0:
        raise ValueError(f"actor_rollout_ref.model.lora_rank={lora_rank} must be > 0 to use LoRA (0 turns it off).")
    if target_modules == "all-linear" and has_fused_experts(lm):
        target_modules = linear_module_names(lm)
    config = LoraConfig(
        r=lora_rank,
        lora_alpha=lora_alpha,
        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
        exclude_modules=exclude_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with _stand_ins_for_meta(lm):
        return get_peft_model(lm, config)


def has_fused_experts(lm: nn.Module) -> bool:
    """Whether `lm` keeps mixture-of-experts weights as 3D parameters (transformers 5's `mlp.experts`)."""
    return any(param.dim() == 3 for name, param in lm.named_parameters() if ".experts." in name)


def linear_module_names(lm: nn.Module) -> list[str]:
    """The names of `lm`'s `nn.Linear` modules but the LM head: what "all-linear" means for a dense model. On a
    mixture-of-experts model peft's "all-linear" would also wrap the routers and the 3D expert parameters
    (`ParamWrapper`), whose adapters the weight sync cannot fold into the engine's weights yet."""
    head = lm.get_output_embeddings()
    names = {name.rsplit(".", 1)[-1] for name, m in lm.named_modules() if isinstance(m, nn.Linear) and m is not head}
    return sorted(names)


def adapter_settings(adapter_path: str) -> dict[str, Any]:
    """The LoRA settings of a saved peft adapter folder, under hyflow's `model.*` key names."""
    from peft import PeftConfig

    try:
        config = PeftConfig.from_pretrained(os.path.expanduser(adapter_path))
    except (OSError, ValueError) as err:
        raise ValueError(
            f"model.lora_adapter_path={adapter_path!r} is not a peft adapter folder ({err}). Fix: point it at a "
            "folder with adapter_config.json and the adapter weights (peft's save_pretrained)."
        ) from err
    targets = config.target_modules
    return {
        "lora_rank": config.r,
        "lora_alpha": config.lora_alpha,
        "target_modules": targets if isinstance(targets, str) else sorted(targets),
        "exclude_modules": config.exclude_modules
        if isinstance(config.exclude_modules, str | None)
        else sorted(config.exclude_modules),
    }


def load_lora_adapter(lm: nn.Module, adapter_path: str) -> nn.Module:
    """Wrap `lm` in the saved peft adapter at `adapter_path` (as adapter "default", trainable; base frozen)."""
    from peft import PeftModel

    with _stand_ins_for_meta(lm):
        return PeftModel.from_pretrained(lm, os.path.expanduser(adapter_path), adapter_name=ADAPTER, is_trainable=True)


def hf_name(name: str) -> str:
    """Strip the wrappers' prefixes (`lm.` of PolicyModel, `base_model.model.` of peft) from a parameter name."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def merged_hf_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]], scaling: float
) -> Iterator[tuple[str, torch.Tensor]]:
    """Turn a (possibly LoRA-wrapped) policy's tensors into Hugging Face names and weights, folding adapters in.

    Tensors of a LoRA-wrapped linear (`X.base_layer.weight`, `X.lora_A.default.weight`, `X.lora_B.default.weight`)
    are buffered until all three arrived, then yielded once as `X.weight` = W + scaling · B · A. Everything else
    streams through with its name cleaned.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        name = hf_name(name)
        match = _LORA_PIECE.match(name)
        if match is None:
            yield name, tensor
            continue
        module, piece, param = match["module"], match["piece"], match["param"]
        if piece == "base_layer" and param == "bias":
            yield f"{module}.bias", tensor
            continue
        parts = pending.setdefault(module, {})
        parts[piece.split(".")[0]] = tensor
        if len(parts) == 3:
            del pending[module]
            base, a, b = parts["base_layer"], parts["lora_A"], parts["lora_B"]
            delta = (b.float() @ a.float()) * scaling
            yield f"{module}.weight", (base.float() + delta).to(base.dtype)
    assert not pending, f"LoRA pieces without their partners: {sorted(pending)}"
