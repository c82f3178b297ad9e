"""Lean loading of mixture-of-experts weights: a checkpoint that stores each expert apart (`experts.{e}.gate_proj`,
`up_proj`, `down_proj`; Mixtral's `w1`, `w3`, `w2`) into transformers 5's fused 3D parameters
(`experts.gate_up_proj` (E, 2I, H), `experts.down_proj` (E, H, I)), each rank reading only its own experts.

    sources = fused_expert_sources(hf_model, "model.layers.0.mlp.experts.gate_up_proj", (4, 64, 32), stored, shapes)
    # [[(gate_0, 0), (up_0, I)], ...]: per expert, the checkpoint keys and the row of dim 1 each starts at
    fill_fused_experts(module, path, {param_name: sources}, stats)

The fusion is the one transformers' conversion mapping declares for the model (`WeightConverter`s whose
operations are `MergeModulelist(dim=0)` and, for gate/up, `Concatenate(dim=1)`): expert e's tensors, concatenated
along their first dim, are row e of the fused parameter. FSDP2 shards the fused parameter along dim 0, the experts,
so a rank holds whole experts: it reads just their per-expert tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hyflow.engine.models import iter_safetensors

ExpertSources = list[list[tuple[str, int]]]  # per expert: (checkpoint key, its first row along dim 1), in order


def _expert_converters(hf_model: nn.Module) -> list[Any]:
    """transformers' converters for `hf_model` that stack per-expert tensors (none before transformers 5)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter
    except ImportError:
        return []
    converters = []
    for converter in get_model_conversion_mapping(hf_model):
        if not isinstance(converter, WeightConverter) or len(converter.target_patterns) != 1:
            continue
        kinds = [type(op) for op in converter.operations]
        merge_first = kinds and kinds[0] is MergeModulelist and converter.operations[0].dim == 0
        rest_ok = kinds[1:] in ([], [Concatenate]) and all(op.dim == 1 for op in converter.operations[1:])
        if merge_first and rest_ok and all("*" in s for s in converter.source_patterns):
            converters.append(converter)
    return converters


def fused_expert_sources(
    hf_model: nn.Module,
    checkpoint_name: str,
    shape: tuple[int, ...],
    stored: dict[str, str],
    shapes: dict[str, tuple[int, ...]],
) -> ExpertSources | None:
    """Per expert, the checkpoint keys that make up its row of the fused parameter `checkpoint_name` of `shape`
    (E, rows, cols), each with the row of dim 1 it starts at: `stored` maps the model's names (after transformers'
    renames) to checkpoint keys, `shapes` their shapes. None unless every expert's tensors exist and their rows add
    up to the parameter's."""
    if len(shape) != 3:
        return None
    for converter in _expert_converters(hf_model):
        target = converter.target_patterns[0]
        if not checkpoint_name.endswith(target):
            continue
        prefix = checkpoint_name[: -len(target)]
        sources = []
        for expert in range(shape[0]):
            names = [prefix + pattern.replace("*", str(expert)) for pattern in converter.source_patterns]
            keys = [stored.get(name) for name in names]
            if any(key is None for key in keys):
                return None
            sources.append(keys)
        fits = all(
            sum(shapes[key][0] for key in keys) == shape[1] and all(shapes[key][1:] == shape[2:] for key in keys)
            for keys in sources
        )
        if not fits:
            return None
        starts = [[sum(shapes[k][0] for k in keys[:i]) for i in range(len(keys))] for keys in sources]
        return [list(zip(keys, first, strict=True)) for keys, first in zip(sources, starts, strict=True)]
    return None


@torch.no_grad()
def fill_fused_experts(module: nn.Module, path: str, experts: dict[str, ExpertSources], stats: Any) -> None:
    """Copy into each fused expert parameter named in `experts` the per-expert tensors of the experts this rank's
    shard holds (FSDP2: rows of dim 0), read whole from `path`'s safetensors; counts what was read in `stats`."""
    from hyflow.workers.lean_load import _local, _own_rows

    tensors = dict(module.named_parameters())
    where: dict[str, tuple[str, int, int]] = {}  # checkpoint key -> (parameter, local expert row, first row)
    for name, sources in experts.items():
        rows = _own_rows(tensors[name])
        start, count = (rows.start, rows.length) if rows is not None else (0, len(sources))
        for expert in range(start, start + count):
            for key, offset in sources[expert]:
                where[key] = (name, expert - start, offset)
    for key, piece in iter_safetensors(path, keep=where.__contains__):
        if key not in where:
            continue  # the same name in two files: the first, as in the plan
        name, row, offset = where.pop(key)
        _local(tensors[name])[row, offset : offset + piece.shape[0]].copy_(piece)
        size = piece.numel() * piece.element_size()
        stats.bytes_read += size
        stats.tensors_read += 1
        stats.largest_read = max(stats.largest_read, size)
    if where:
        raise RuntimeError(
            f"lean load: {path} no longer holds {sorted(where)[:5]}, which its safetensors headers listed a moment "
            "before; is another process rewriting the checkpoint folder?"
        )
