"""What the training engine needs to know about vision-language models (Qwen2-VL & co.).

    is_vision_language(config)               # the config has a vision tower (`vision_config`)
    auto_model_class(config)                 # AutoModelForImageTextToText for a VLM, else AutoModelForCausalLM
    backbone = vision_language_backbone(lm)  # vision tower + language model, returns hidden states
    backbone, hidden_size = value_backbone(lm)   # what a critic puts its value head on
    vision = batch_vision_inputs(rows, device)   # {"pixel_values": (ΣN_i, D), "image_grid_thw": (ΣK_i, 3), ...}
    freeze_vision_tower(lm)                  # no gradients into the vision encoder (its merger stays trainable)

Per-row processor outputs (`multi_modal_inputs`, one dict per row) are concatenated in row order: the model
scatters the image embeddings into the `<|image_pad|>` positions of the batch in that same order, so any subset of
rows (a micro-batch, a token-budget bin, a shuffled mini-batch) stays consistent as long as its rows' dicts travel
with it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# second_per_grid_ts (num_videos,): Qwen2.5-VL's seconds per temporal patch, which `generate` reads for the positions.
VISION_INPUT_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def is_vision_language(config: Any) -> bool:
    """Whether a Hugging Face config describes a vision-language model (it has a `vision_config`)."""
    return getattr(config, "vision_config", None) is not None


def auto_model_class(config: Any) -> type:
    """The transformers Auto class that builds a model of `config`: image-text-to-text for a vision-language
    model, causal LM otherwise (the one place that choice is made)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM


def _base_model(lm: nn.Module) -> nn.Module:
    """The Hugging Face model under a peft wrapper (the model itself otherwise)."""
    return lm.get_base_model() if hasattr(lm, "get_base_model") else lm


def vision_language_backbone(lm: nn.Module) -> nn.Module:
    """The module that maps (input_ids, pixel_values, ...) to the last hidden states (`Qwen2VLModel` & co.)."""
    base = _base_model(lm)
    backbone = getattr(base, "model", None)
    if backbone is None or not is_vision_language(base.config):
        raise ValueError(
            f"{type(base).__name__} got image inputs but is not a vision-language model (no vision_config); "
            "point model.path at a VLM folder (e.g. Qwen2-VL) or drop the data's images column."
        )
    return backbone


def text_model(module: nn.Module) -> nn.Module:
    """The language model inside a vision-language model or its backbone (`Qwen2VLTextModel`), the part whose
    attention a packed forward replaces; a text-only model itself."""
    base = _base_model(module)
    if not is_vision_language(base.config):
        return base
    backbone = base if hasattr(base, "language_model") else vision_language_backbone(base)
    return backbone.language_model


def vision_encoder_outputs(backbone: nn.Module, vision: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The vision tower's outputs for a batch's images and videos (`vision`: `batch_vision_inputs`), in the form
    the backbone's `mm_encoder_outputs` argument takes, so its forward skips the tower and its keyword arguments
    (a packed forward's row boundaries) reach the language model only."""
    outputs = {}
    if "pixel_values" in vision:
        outputs["image"] = backbone.get_image_features(
            vision["pixel_values"], vision["image_grid_thw"], return_dict=True
        )
    if "pixel_values_videos" in vision:
        video = backbone.get_video_features(vision["pixel_values_videos"], vision["video_grid_thw"], return_dict=True)
        outputs["video"] = video
    return outputs


def value_backbone(lm: nn.Module) -> tuple[nn.Module, int]:
    """(backbone, hidden size) of a critic built from `lm`: the decoder of a causal LM, or a vision-language
    model's vision tower + language model, so the critic sees the images too."""
    config = lm.config
    if is_vision_language(config):
        return vision_language_backbone(lm), config.get_text_config().hidden_size
    return lm.get_decoder(), config.hidden_size


def vision_tower(lm: nn.Module) -> nn.Module:
    """The vision encoder of a vision-language model (`model.visual` in Qwen2-VL / Qwen2.5-VL)."""
    backbone = vision_language_backbone(lm)
    for name in ("visual", "vision_tower", "vision_model"):
        if isinstance(getattr(backbone, name, None), nn.Module):
            return getattr(backbone, name)
    raise ValueError(f"{type(backbone).__name__} has no vision tower named visual / vision_tower / vision_model.")


def freeze_vision_tower(lm: nn.Module) -> int:
    """Stop gradients into the vision encoder's blocks (the patch merger, which projects into the language model,
    stays trainable as in verl's `freeze_vision_tower`); returns the number of frozen parameters."""
    tower = vision_tower(lm)
    frozen = 0
    for name, parameter in tower.named_parameters():
        if not name.startswith("merger."):
            parameter.requires_grad_(False)
            frozen += parameter.numel()
    return frozen


def batch_vision_inputs(rows: list[dict[str, torch.Tensor]] | None, device: torch.device) -> dict[str, torch.Tensor]:
    """The rows' vision inputs (images and videos) concatenated in row order, key by key, and moved to `device`;
    {} when no row has any."""
    vision = {}
    for key in VISION_INPUT_KEYS:
        parts = [row[key] for row in rows or [] if row and row.get(key) is not None]
        if parts:
            vision[key] = torch.cat(parts).to(device)
    return vision


# Families whose video positions hyflow's M-RoPE index (hyflow/engine/models/mrope.py) computes: Qwen2-VL counts
# temporal patches; Qwen2.5-VL spaces them by time, tokens_per_second · second_per_grid_ts (its processor outputs).
VIDEO_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
TIME_SCALED_FAMILIES = ("qwen2_5_vl",)


def check_videos_supported(config: Any, vision: dict[str, torch.Tensor]) -> None:
    """ValueError when a batch has videos for a model family whose video positions hyflow does not compute, or
    Qwen2.5-VL videos without `second_per_grid_ts` (their positions would not be the model's)."""
    if "pixel_values_videos" not in vision:
        return
    model_type = getattr(config, "model_type", None)
    if model_type not in VIDEO_FAMILIES:
        raise ValueError(
            f"the batch has videos, but hyflow computes video M-RoPE positions for {list(VIDEO_FAMILIES)} only, not "
            f"model_type={model_type!r}; train videos with a Qwen2-VL / Qwen2.5-VL model or drop the data's "
            "videos column (data.video_key)."
        )
    if model_type in TIME_SCALED_FAMILIES and "second_per_grid_ts" not in vision:
        raise ValueError(
            f"the batch has videos for model_type={model_type!r} but no second_per_grid_ts (seconds per temporal "
            "patch), which its video positions are scaled by; load the processor with "
            "hyflow.models.processor.load_processor(model_path), which makes the data carry it."
        )


def mm_token_type_ids(input_ids: torch.Tensor, config: Any) -> torch.Tensor:
    """transformers' token types of a Qwen2-VL-style batch, same shape as `input_ids`: 0 text, 1 an image pad,
    2 a video pad (what `generate` reads to place the vision embeddings and compute the M-RoPE positions)."""
    types = (input_ids == config.image_token_id).long()
    video_token_id = getattr(config, "video_token_id", None)
    if video_token_id is not None:
        types = types + 2 * (input_ids == video_token_id).long()
    return types
