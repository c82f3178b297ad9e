"""The engine's own model implementations, picked by `config.architectures`, and weight loading by HF name.

    model = load_model("path/to/hf_folder", dtype=torch.bfloat16, device="cuda", max_positions=4096)
    model = load_model(hf_module)                    # a `transformers` model: config + state dict, no disk
    model = load_model(path, tp=TensorParallel.from_world(2))   # this rank's tensor-parallel shard (parallel.py)
    vision = load_vision(path, dtype=torch.bfloat16, device="cuda")   # a VLM's vision tower (None: a text model)

A mixture-of-experts model (Qwen3-MoE, Qwen2-MoE, Mixtral) is the same decoder with sparse expert blocks in place
of the dense MLPs (moe.py).

A vision-language model (Qwen2-VL, Qwen2.5-VL) is its decoder, built here from `config.text_config`, plus
transformers' vision tower for the family (vision.py), which the engine runs at prefill.

`is_supported(hf_config)` says whether the engine can run an architecture; others fall back to `rollout.name=hf`.
`tp_weight_slices(model.args, name)` says which slice of an HF weight each rank of a tensor-parallel model holds (what a
weight sync sends each rank; `load_weights` takes the full tensor or that slice).
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from hyflow.engine.models.llama import DecoderArgs, DecoderForCausalLM
from hyflow.engine.models.vision import (
    VISION_PREFIXES,
    VISION_TOWERS,
    VisionTower,
    decoder_weights,
    has_vision,
    load_vision_tower,
    route_weight_name,
)
from hyflow.engine.parallel import TensorParallel, TensorSlice

# HF architecture name -> decoder family (the switches `DecoderArgs.from_hf` applies).
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",  # mixture of experts (moe.py)
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral",
    "Qwen2VLForConditionalGeneration": "qwen2",  # + the vision tower (vision.py)
    "Qwen2_5_VLForConditionalGeneration": "qwen2",
}


def family_of(hf_config: Any) -> str | None:
    """The decoder family of a config, or None when the engine does not implement its architecture."""
    for arch in getattr(hf_config, "architectures", None) or []:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    model_type = getattr(hf_config, "model_type", None)
    if model_type in VISION_TOWERS:  # a vision-language config without `architectures`
        return "qwen2"
    return model_type if model_type in ARCHITECTURES.values() else None


def is_supported(hf_config: Any) -> bool:
    return family_of(hf_config) is not None


def tp_weight_slices(args: DecoderArgs, name: str) -> list[TensorSlice | None] | None:
    """For the HF weight `name` (a decoder's or a vision-language model's): the slice of the full tensor that each
    TP rank of a model of `args` (`model.args`) holds, by TP rank (None where a rank holds all of it); None when
    every rank holds the whole tensor (norms, the vision tower, a model without tensor parallelism)."""
    kind, routed = route_weight_name(name)
    if kind != "decoder" or args.tp_size == 1:
        return None
    slices = [args.sharded(args.tp_size, rank).hf_slice(routed) for rank in range(args.tp_size)]
    return None if all(piece is None for piece in slices) else slices


def _own_slice(args: DecoderArgs, name: str) -> TensorSlice | None:
    """The slice of HF weight `name` that the TP rank of `args` holds (None: all of it)."""
    slices = tp_weight_slices(args, name)
    return None if slices is None else slices[args.tp_rank]


def build_model(
    hf_config: Any,
    max_positions: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    tp: TensorParallel | None = None,
) -> DecoderForCausalLM:
    """An engine model with the config's shape, or this rank's shard of it with `tp` (weights uninitialised until
    `load_weights`)."""
    tp = tp or TensorParallel()
    family = family_of(hf_config)
    if family is None:
        raise ValueError(
            f"architectures={getattr(hf_config, 'architectures', None)} is not implemented by the "
            f"hyflow engine (supported: {sorted(ARCHITECTURES)}); set rollout.name=hf to use "
            "transformers.generate for it"
        )
    args = DecoderArgs.from_hf(hf_config.get_text_config(), family, max_positions)
    args = args.sharded(tp.size, tp.rank)
    with torch.device(device):
        model = DecoderForCausalLM(args, tp)
    model.to(dtype)
    return model.eval().requires_grad_(False)


def iter_safetensors(
    path: str,
    keep: Callable[[str], bool] | None = None,
    slice_of: Callable[[str], TensorSlice | None] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in the `*.safetensors` files of a Hugging Face folder (whose name `keep`
    accepts: the others are not read); with `slice_of`, only the slice of each tensor it names is read (a TP rank's
    part: the rest never leaves the file)."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(
            f"model path {path!r} holds no *.safetensors files; save the model with "
            "`model.save_pretrained(path)` (safe_serialization is the default)"
        )
    for file in files:
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open handles are not dicts)
                if keep is not None and not keep(name):
                    continue
                piece = None if slice_of is None else slice_of(name)
                if piece is None:
                    yield name, handle.get_tensor(name)
                else:
                    index = (slice(None),) * piece.dim + (slice(piece.start, piece.start + piece.length),)
                    yield name, handle.get_slice(name)[index]


def load_model(
    source: str | nn.Module,
    max_positions: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    tp: TensorParallel | None = None,
) -> DecoderForCausalLM:
    """An engine model with the weights of a HF folder or an in-memory `transformers` model (with `tp`, this
    rank's shard of them: from a folder, only that shard is read)."""
    if isinstance(source, nn.Module):
        hf_config = source.config
    else:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(source)
    max_positions = max_positions or hf_config.get_text_config().max_position_embeddings
    model = build_model(hf_config, max_positions, dtype, device, tp)
    if isinstance(source, nn.Module):
        weights = source.state_dict().items()
    else:
        weights = iter_safetensors(source, slice_of=functools.partial(_own_slice, model.args))
    model.load_weights(decoder_weights(weights) if has_vision(hf_config) else weights)
    return model


def load_vision(
    source: str | nn.Module, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> VisionTower | None:
    """The vision tower of a vision-language folder or in-memory `transformers` model, with its weights; None for a
    text model."""
    if isinstance(source, nn.Module):
        hf_config, weights = source.config, source.state_dict().items()
    else:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(source)
        weights = iter_safetensors(source, keep=lambda name: name.startswith(VISION_PREFIXES))
    if not has_vision(hf_config):
        return None
    return load_vision_tower(hf_config, weights, dtype, device)
