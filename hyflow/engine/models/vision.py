"""The vision encoder of a vision-language model (Qwen2-VL, Qwen2.5-VL) for the engine's prefill, and the routing of
a VLM's weight names between it and the engine's decoder.

    tower = load_vision_tower(hf_config, hf_named_weights, torch.bfloat16, "cuda")
    features = tower.encode(pixel_values, grid_thw)     # (sum_k t_k*h_k*w_k / m^2, E): one row per image token
    kind, name = route_weight_name("model.language_model.layers.0.mlp.up_proj.weight")  # ("decoder", "model.layers...")

The encoder is transformers' own module for the family (`Qwen2VisionTransformerPretrainedModel`, ...), built from
`config.vision_config` on the engine's device and dtype and filled with the folder's (or the trainer's) weights, so
its output is the image embedding the Hugging Face model scatters into its `<|image_pad|>` positions. Weight names
come in two spellings: transformers 5 in memory (`model.visual.*`, `model.language_model.*`) and the checkpoints
on disk (`visual.*`, `model.*`); both are accepted.

Shapes: N patches of all images (pixel_values (N, C*T*P*P)), K images (grid_thw (K, 3)), m = spatial merge size.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

# model_type -> (module, class) of transformers' vision encoder for the family
VISION_TOWERS: dict[str, tuple[str, str]] = {
    "qwen2_vl": ("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VisionTransformerPretrainedModel"),
    "qwen2_5_vl": ("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VisionTransformerPretrainedModel"),
}
VISION_PREFIXES = ("model.visual.", "visual.")
DECODER_PREFIXES = {"model.language_model.": "model.", "language_model.model.": "model.", "language_model.": ""}


def has_vision(hf_config: Any) -> bool:
    """Whether a Hugging Face config describes a vision-language model (it has a `vision_config`)."""
    return getattr(hf_config, "vision_config", None) is not None


def route_weight_name(name: str) -> tuple[str, str]:
    """("vision", name inside the vision tower) or ("decoder", the decoder's HF name) of one weight name."""
    for prefix in VISION_PREFIXES:
        if name.startswith(prefix):
            return "vision", name[len(prefix) :]
    for prefix, replacement in DECODER_PREFIXES.items():
        if name.startswith(prefix):
            return "decoder", replacement + name[len(prefix) :]
    return "decoder", name


def decoder_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The decoder's weights of a (possibly vision-language) model, under the decoder's names."""
    for name, tensor in weights:
        kind, routed = route_weight_name(name)
        if kind == "decoder":
            yield routed, tensor


def vision_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The vision tower's weights of a vision-language model, under their names inside the tower."""
    for name, tensor in weights:
        kind, routed = route_weight_name(name)
        if kind == "vision":
            yield routed, tensor


class VisionTower(nn.Module):
    """transformers' vision encoder of one family, run at prefill; `encode` -> one embedding per image token."""

    def __init__(self, hf_config: Any, dtype: torch.dtype, device: str | torch.device) -> None:
        super().__init__()
        model_type = getattr(hf_config, "model_type", None)
        if model_type not in VISION_TOWERS:
            raise ValueError(
                f"model_type={model_type!r}: the hyflow engine runs the vision encoders of {sorted(VISION_TOWERS)} "
                "only; set rollout.name=hf to generate with transformers for this vision-language model"
            )
        module, class_name = VISION_TOWERS[model_type]
        tower_class = getattr(importlib.import_module(module), class_name)
        with torch.device(device):
            self.tower = tower_class._from_config(hf_config.vision_config, dtype=dtype)
        self.tower.eval().requires_grad_(False)
        self.params = dict(self.tower.named_parameters())
        self.merge_size = hf_config.vision_config.spatial_merge_size
        self.dtype = dtype

    @torch.inference_mode()
    def encode(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Embeddings (sum_k t_k*h_k*w_k / m^2, E) of the images whose patches are `pixel_values` (N, D) and whose
        grids are `grid_thw` (K, 3), image after image, each image's rows in its pad tokens' order."""
        device = next(self.tower.parameters()).device
        out = self.tower(pixel_values.to(device, self.dtype), grid_thw=grid_thw.to(device))
        return out.pooler_output

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copies tensors named as inside the tower (`blocks.0.attn.qkv.weight`, ...) in place; returns the count."""
        params, count = self.params, 0
        for name, tensor in weights:
            if name not in params:
                raise KeyError(
                    f"vision weight {name!r} is not a parameter of {type(self.tower).__name__} (expected names "
                    "such as 'visual.blocks.0.attn.qkv.weight'); the model config and the weights disagree"
                )
            if tuple(tensor.shape) != tuple(params[name].shape):
                raise ValueError(
                    f"vision weight {name!r} has shape {tuple(tensor.shape)}, the engine expects "
                    f"{tuple(params[name].shape)}; the model config and the weights disagree"
                )
            params[name].copy_(tensor)
            count += 1
        return count


def load_weights(decoder: nn.Module, vision: VisionTower | None, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Routes HF-named weights to the decoder and (for a VLM) the vision tower, in one pass; returns the count."""
    vision_count = 0

    def decoder_part() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal vision_count
        for name, tensor in weights:
            kind, routed = route_weight_name(name)
            if kind == "decoder":
                yield routed, tensor
            elif vision is not None:
                vision_count += vision.load_weights([(routed, tensor)])
            else:
                raise KeyError(f"weight {name!r} belongs to a vision tower, but the engine's model has none")

    return decoder.load_weights(decoder_part()) + vision_count


def load_vision_tower(
    hf_config: Any, weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, device: str | torch.device
) -> VisionTower:
    """The vision tower of a VLM config, filled with the vision part of `weights` (HF names, the model's whole
    state dict or only its vision tensors); ValueError when some of its parameters are missing."""
    tower = VisionTower(hf_config, dtype, device)
    expected = len(tower.params)
    loaded = tower.load_weights(vision_weights(weights))
    if loaded != expected:
        raise ValueError(
            f"the vision tower has {expected} parameters but the model holds {loaded} vision weights (names "
            "starting with 'visual.' or 'model.visual.'); the folder's weights are incomplete"
        )
    return tower
