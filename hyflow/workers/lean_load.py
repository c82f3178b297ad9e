"""Memory-lean loading of a role's weights into its FSDP2 shards (actor, ref, critic, reward model): each rank
reads only its own rows.

    module, stats = build_sharded(make, path, fsdp_config, mesh)  # make(empty_weights) -> (module, hf_model)
    stats.mode, stats.bytes_read                                  # "sliced", what this rank read from the folder

Loading the whole checkpoint into every rank's host memory before FSDP2 shards it costs world_size × the model
on one node (8 × ~65 GB for a 32B model in bf16 on 8 GPUs). With several ranks, `build_sharded` instead:

1. builds the module with every parameter on the `meta` device (`make(True)`, `loader.parameters_on_meta`):
   nothing is allocated or read; buffers are real, computed by the modules' own `__init__` (rotary `inv_freq`);
   parameters a builder creates outside the loader are real, with their usual values: the critic's value head,
   LoRA adapters (`hyflow.models.lora` keeps them off meta, so peft's random draws are a full load's);
2. shards it with FSDP2 (`apply_fsdp2`) and allocates only this rank's shards of the meta parameters
   (`materialize_meta_parameters`, on the CPU when offloaded: swapped in place, so tied weights stay one
   parameter);
3. fills them, by one of two ways chosen by `slice_plan` (the same choice on every rank: it reads only headers):
   - **sliced**: every meta parameter (and persistent buffer) has a tensor of the same name (after the renames
     transformers applies on load, `checkpoint_renamer`: a VLM's older layout, a base-model prefix) and shape in
     the folder's `*.safetensors`: each rank reads its rows ⌈N/W⌉·rank .. of each tensor through
     `safe_open(...).get_slice` (`hyflow.engine.models.iter_safetensors`), one tensor at a time, and copies them
     into its local shard (cast to the module's dtype as `from_pretrained` casts). Host memory: this rank's shards
     (where they live: CPU ranks and offload) plus one tensor's rows in flight.
     Mixture-of-experts weights stored per expert fill transformers' fused 3D expert parameters the same way,
     each rank reading only its own experts' tensors (`lean_load_experts`).
   - **broadcast from rank 0**, where a name does not match: a folder without safetensors, a checkpoint
     transformers converts otherwise while loading (a quantised checkpoint). Rank 0 builds the module as
     one process does (`make(False)`: `from_pretrained`, from the random state the skeleton started from, so its
     random draws are a full load's), and `set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)`
     sends every rank its shards. Only rank 0 holds the whole model.

One rank, or no process group, builds as before (`make(False)`, then `apply_fsdp2`): there is nothing to split.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from hyflow.engine.models import iter_safetensors
from hyflow.engine.parallel import TensorSlice
from hyflow.workers.fsdp import apply_fsdp2, shard_rows, training_device
from hyflow.workers.lean_load_experts import ExpertSources, fill_fused_experts, fused_expert_sources

logger = logging.getLogger(__name__)

Make = Callable[[bool], tuple[nn.Module, nn.Module]]  # empty_weights -> (module, the transformers model inside)


@dataclasses.dataclass
class LoadStats:
    """How this rank's weights were filled: `mode` ("full", "sliced", "broadcast"), and the bytes and tensors it
    read from the checkpoint through the sliced reader (`largest_read`: the biggest single read)."""

    mode: str
    bytes_read: int = 0
    tensors_read: int = 0
    largest_read: int = 0
    reason: str = ""


@dataclasses.dataclass
class SlicePlan:
    """Module tensor name -> checkpoint key for every meta parameter and persistent buffer; `missing` names
    those without a tensor of the same name and shape; `quantization` the `quant_method` of a quantised checkpoint
    (its `config.json` has a `quantization_config`: `from_pretrained` quantises or dequantises while loading, which
    a plain cast does not reproduce). Unless `sliced`, the load is a broadcast from rank 0."""

    keys: dict[str, str]
    missing: list[str]
    has_safetensors: bool
    quantization: str | None = None
    experts: dict[str, ExpertSources] = dataclasses.field(default_factory=dict)  # fused MoE experts, per expert

    @property
    def sliced(self) -> bool:
        return self.has_safetensors and not self.missing and self.quantization is None


def checkpoint_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the `*.safetensors` files of `path` (headers only, nothing read)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(file, framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not dicts)
                shapes.setdefault(key, tuple(handle.get_slice(key).get_shape()))  # the first, as read
    return shapes


def checkpoint_prefixes(module: nn.Module, hf_model: nn.Module) -> dict[str, str]:
    """Module-name prefix -> checkpoint-name prefix: a child holding `hf_model` reads `lm.` -> `` (PolicyModel's
    `lm`, or `lm.base_model.model.` under peft), a child inside it reads `name.` -> its path in `hf_model` (the
    critic's `backbone.` -> `model.`); other children (the value head) have no checkpoint name. A module that is
    the transformers model itself (the reward model's sequence classifier) reads every name as it is."""
    if module is hf_model:
        return {"": ""}
    inside = {id(sub): path for path, sub in hf_model.named_modules()}
    prefixes = {}
    for name, child in module.named_children():
        holds = [path for path, sub in child.named_modules() if sub is hf_model]
        if holds:
            prefixes[f"{name}.{holds[0]}." if holds[0] else f"{name}."] = ""
        elif id(child) in inside:
            prefixes[f"{name}."] = f"{inside[id(child)]}." if inside[id(child)] else ""
    return prefixes


def _checkpoint_name(name: str, prefixes: dict[str, str]) -> str | None:
    """The checkpoint name of a module tensor: its prefix replaced, and peft's `.base_layer` (the wrapped
    linear of a LoRA layer) dropped."""
    for prefix, replacement in prefixes.items():
        if name.startswith(prefix):
            return replacement + name[len(prefix) :].replace(".base_layer.", ".")
    return None


def checkpoint_renamer(hf_model: nn.Module) -> Callable[[str], str]:
    """The renames transformers applies to a checkpoint's names while loading into `hf_model`, so such a checkpoint
    still loads sliced: (transformers 5) its conversion mapping's renames (a VLM saved in the older `visual.` /
    `model.` layout), then the base-model prefix (`base_model_prefix`: a checkpoint of the bare backbone, `layers.0.`,
    loading into a model with a head, `model.layers.0.`, and the reverse). Conversions that change values or shapes
    (fused MoE experts) are not renames: `lean_load_experts` plans those."""
    renamings = _conversion_renamings(hf_model)
    prefix = getattr(hf_model, "base_model_prefix", "")
    names = {name.replace(".base_layer.", ".") for name in hf_model.state_dict(keep_vars=True)}  # peft's base_layer

    def rename(key: str) -> str:
        if renamings:
            from transformers.core_model_loading import apply_renamings

            key = apply_renamings(key, renamings)
        return with_base_model_prefix(key, prefix, names)

    return rename


def _conversion_renamings(hf_model: nn.Module) -> list:
    """The `WeightRenaming`s of transformers' conversion mapping for `hf_model` (none before transformers 5)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming
    except ImportError:
        return []
    return [t for t in get_model_conversion_mapping(hf_model) if isinstance(t, WeightRenaming)]


def with_base_model_prefix(key: str, prefix: str, names: set[str]) -> str:
    """`key` with the base-model `prefix` added or stripped where only that makes it one of the model's `names`, as
    `from_pretrained` matches a backbone's checkpoint with a model that has a head (and the reverse)."""
    if key in names or not prefix:
        return key
    if f"{prefix}.{key}" in names:
        return f"{prefix}.{key}"
    if key.startswith(f"{prefix}.") and key[len(prefix) + 1 :] in names:
        return key[len(prefix) + 1 :]
    return key


def slice_plan(module: nn.Module, hf_model: nn.Module, path: str) -> SlicePlan:
    """Match every meta parameter (under any of its tied names) and persistent buffer of `module` with a
    checkpoint tensor of the same name (after transformers' renames) and shape."""
    shapes = checkpoint_shapes(path)
    rename = checkpoint_renamer(hf_model)
    stored: dict[str, str] = {}  # the module's name -> the checkpoint's: a tensor of that very name first
    for key in shapes:
        name = rename(key)
        if stored.get(name) != name:
            stored[name] = key
    prefixes = checkpoint_prefixes(module, hf_model)
    aliases: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    persistent = set(module.state_dict(keep_vars=True))
    tensors = [(name, p, aliases[id(p)]) for name, p in module.named_parameters() if p.device.type == "meta"]
    tensors += [(name, b, [name]) for name, b in module.named_buffers() if name in persistent]
    keys, missing, experts = {}, [], {}
    for name, tensor, names in tensors:
        candidates = [stored.get(_checkpoint_name(alias, prefixes)) for alias in names]
        found = [key for key in candidates if key is not None and shapes[key] == tuple(tensor.shape)]
        checkpoint_name = _checkpoint_name(name, prefixes) or ""
        if found:
            keys[name] = found[0]
        elif fused := fused_expert_sources(hf_model, checkpoint_name, tuple(tensor.shape), stored, shapes):
            experts[name] = fused
        else:
            missing.append(name)
    quantization = quant_method(hf_model.config)
    return SlicePlan(keys, missing, has_safetensors=bool(shapes), quantization=quantization, experts=experts)


def quant_method(config: Any) -> str | None:
    """The `quant_method` of a model config's `quantization_config` (a dict or transformers' object), or None."""
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization.quant_method
    return str(method or "unknown")


def materialize_meta_parameters(module: nn.Module, device: torch.device) -> int:
    """Allocate (uninitialised) every meta parameter of `module` on `device`: a DTensor's local shard only. Each
    Parameter object is swapped in place, so tied weights and FSDP2's references stay; returns how many."""
    count = 0
    for param in module.parameters():  # each tied parameter once
        if param.device.type == "meta":
            empty = torch.empty_like(param, device=device)
            torch.utils.swap_tensors(param, nn.Parameter(empty, requires_grad=param.requires_grad))
            count += 1
    return count


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor this rank writes into: a DTensor's local shard (FSDP2: rows of dim 0), else the tensor."""
    if not isinstance(tensor, DTensor):
        return tensor
    assert tensor.device_mesh.ndim == 1 and tuple(tensor.placements) == (Shard(0),), tensor.placements
    return tensor.to_local()


def _own_rows(tensor: torch.Tensor) -> TensorSlice | None:
    """The rows of the full tensor that this rank's shard holds (None: all of it, a replicated tensor)."""
    if not isinstance(tensor, DTensor):
        return None
    mesh = tensor.device_mesh
    start, rows = shard_rows(tensor.shape[0], mesh.size(), mesh.get_local_rank())
    return TensorSlice(dim=0, start=start, length=rows, full=tensor.shape[0])


@torch.no_grad()
def fill_from_safetensors(module: nn.Module, path: str, keys: dict[str, str], stats: LoadStats) -> None:
    """Copy into every tensor named in `keys` its rows of the checkpoint tensor it maps to, read one at a time
    from `path`'s safetensors; counts what was read in `stats`."""
    tensors = dict(module.named_parameters()) | dict(module.named_buffers())
    targets: dict[str, list[str]] = {}
    for name, key in keys.items():
        targets.setdefault(key, []).append(name)

    def slice_of(key: str) -> TensorSlice | None:
        return _own_rows(tensors[targets[key][0]])

    filled = set()
    for key, piece in iter_safetensors(path, keep=targets.__contains__, slice_of=slice_of):
        if key in filled:
            continue  # the same name in two files: the first, as in the plan
        size = piece.numel() * piece.element_size()
        stats.bytes_read += size
        stats.tensors_read += 1
        stats.largest_read = max(stats.largest_read, size)
        for name in targets[key]:
            _local(tensors[name]).copy_(piece)
        filled.add(key)
    if filled != set(targets):  # the folder changed between the plan and the read
        raise RuntimeError(
            f"lean load: {path} no longer holds {sorted(set(targets) - filled)[:5]}, which its safetensors headers "
            "listed a moment before; is another process rewriting the checkpoint folder?"
        )


def _broadcast_reason(plan: SlicePlan) -> str:
    if not plan.has_safetensors:
        return "no *.safetensors in the folder"
    if plan.quantization is not None:
        return f"a quantised checkpoint (quant_method={plan.quantization}): from_pretrained converts its tensors"
    return f"{len(plan.missing)} tensors have no checkpoint tensor of their name and shape, e.g. {plan.missing[0]}"


def full_state_on_rank0(make: Make, skeleton: nn.Module, rng: torch.Tensor, path: str) -> dict[str, torch.Tensor]:
    """Rank 0: the state dict of the full load (`make(False)`, from the random state `rng`); the other ranks: {}.
    A failure on rank 0, or a model whose tensor names are not the skeleton's (remote code or a quantiser that
    changes the modules while loading), is raised on every rank, so none waits in the broadcast for rank 0."""
    state: dict[str, torch.Tensor] = {}
    error: Exception | None = None
    if dist.get_rank() == 0:
        try:
            torch.random.set_rng_state(rng)  # rank 0 draws what a full load draws (LoRA's initialisation)
            state = make(False)[0].state_dict()
            extra, absent = set(state) - set(skeleton.state_dict()), set(skeleton.state_dict()) - set(state)
            if extra or absent:
                raise ValueError(
                    f"{path}: from_pretrained builds other tensors than the folder's config.json does (only in the "
                    f"loaded model: {sorted(extra)[:3]}, only in the config's: {sorted(absent)[:3]}); for a quantised "
                    "checkpoint, point the path at its unquantised (bf16) weights."
                )
        except Exception as exc:  # raised below, once the other ranks know
            error = exc
    message = [None if error is None else f"{type(error).__name__}: {error}"]
    dist.broadcast_object_list(message, src=0)
    if error is not None:
        raise error
    if message[0] is not None:
        raise RuntimeError(f"lean load: rank 0 could not load {path}, so no rank can: {message[0]}")
    return state


def build_sharded(make: Make, path: str, fsdp_config: Any, mesh: DeviceMesh | None, key: str = "fsdp_config"):
    """(the module sharded by `apply_fsdp2(module, fsdp_config, mesh, key)`, `LoadStats`): built lean over several
    ranks (see the module docstring), else as before. `make(empty_weights)` builds the module and returns it with
    the transformers model it wraps (whose names are the checkpoint's)."""

    def shard(module: nn.Module) -> nn.Module:
        return apply_fsdp2(module, fsdp_config, mesh, key)

    if mesh is None or mesh.size() == 1:
        return shard(make(False)[0]), LoadStats("full")
    rng = torch.random.get_rng_state()
    module, hf_model = make(True)
    plan = slice_plan(module, hf_model, path)
    offload = fsdp_config.param_offload or fsdp_config.offload_policy
    device = torch.device("cpu") if offload else training_device()  # where FSDP2 keeps the shards
    if plan.sliced:
        stats = LoadStats("sliced")
        shard(module)
        materialize_meta_parameters(module, device)
        fill_from_safetensors(module, path, plan.keys, stats)
        fill_fused_experts(module, path, plan.experts, stats)
    else:
        reason = _broadcast_reason(plan)
        stats = LoadStats("broadcast", reason=reason)
        state = full_state_on_rank0(make, module, rng, path)
        shard(module)
        materialize_meta_parameters(module, device)
        set_model_state_dict(
            module, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True)
        )
        del state
    logger.info(
        "lean load (%s%s): %d tensors, %.1f MB read from %s by this rank",
        stats.mode,
        f": {stats.reason}" if stats.reason else "",
        stats.tensors_read,
        stats.bytes_read / 1e6,
        path,
    )
    return module, stats
