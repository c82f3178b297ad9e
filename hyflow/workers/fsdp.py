"""FSDP2 wrapping and the helpers around it: device, mesh, mixed precision, offload, full-weight gathering.

    mesh = build_device_mesh()                                     # 1-D mesh over all ranks (cuda or cpu)
    apply_fsdp2(model, fsdp_config, mesh)                          # fully_shard per decoder layer, then the root
    for name, tensor in iter_full_state(model): ...                # gathered weights, one parameter at a time

On CUDA, parameters are cast to `mixed_precision.param_dtype` (bf16) for compute and gradients are reduced in
`reduce_dtype` (fp32); on CPU everything stays fp32. `param_offload` / `offload_policy` keep the sharded parameters
(and so the optimizer step) on CPU between uses (`CPUOffloadPolicy`); `optimizer_offload` moves the optimizer
state to CPU between steps. With one rank there is nothing to shard: when the policy casts (CUDA, bf16) and nothing
is offloaded, FSDP2 is left out and `mixed_precision.SingleRankMixedPrecision` casts the fp32 weights into bf16
compute copies once per step (FSDP2's numbers, without its one-rank all-gather and gradient copies); otherwise only
the root is wrapped (one parameter group, kept gathered from forward to backward).
Without an initialised process group (e.g. a unit test of the actor alone) the model is not wrapped at all and
these helpers act on the plain module.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from hyflow.workers.mixed_precision import SingleRankMixedPrecision

logger = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def training_device() -> torch.device:
    """The device this process trains on: its current CUDA device, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def to_dtype(name: str, key: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"{key}={name!r} is not a dtype hyflow knows; use one of {list(DTYPES)}.")
    return DTYPES[name]


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def build_device_mesh() -> DeviceMesh | None:
    """A 1-D data-parallel mesh over all ranks, or None without a process group."""
    if not is_distributed():
        return None
    return init_device_mesh(training_device().type, (dist.get_world_size(),), mesh_dim_names=("dp",))


def decoder_layer_classes(model: nn.Module, wrap_policy: Any = None) -> set[str]:
    """Names of the classes FSDP2 shards on their own: `wrap_policy.transformer_layer_cls_to_wrap`, else the
    `_no_split_modules` that Hugging Face models declare (their decoder-layer classes)."""
    explicit = getattr(wrap_policy, "transformer_layer_cls_to_wrap", None)
    if explicit:
        return set(explicit)
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    return names


def apply_fsdp2(model: nn.Module, fsdp_config: Any, mesh: DeviceMesh | None, key: str = "fsdp_config") -> nn.Module:
    """`fully_shard` each decoder layer and then the root, in place; returns the model.

    Without a mesh (no process group) the model is moved to the training device and returned unwrapped.
    """
    device = training_device()
    offload = bool(fsdp_config.param_offload or fsdp_config.offload_policy)
    if mesh is None:
        return model.to(device)
    if device.type == "cuda":
        precision = fsdp_config.mixed_precision
        mp_policy = MixedPrecisionPolicy(
            param_dtype=to_dtype(precision.param_dtype, f"{key}.mixed_precision.param_dtype"),
            reduce_dtype=to_dtype(precision.reduce_dtype, f"{key}.mixed_precision.reduce_dtype"),
        )
    else:
        mp_policy = MixedPrecisionPolicy()  # CPU: fp32 compute and reduction
    param_dtype = mp_policy.param_dtype
    casts = param_dtype is not None and any(p.dtype != param_dtype for p in model.parameters())
    if mesh.size() == 1 and not offload and casts:
        # One rank and a cast: FSDP2's one-rank all-gather and gradient copies would move the weights for nothing.
        model.to(device).single_rank_precision = SingleRankMixedPrecision(model, param_dtype, mp_policy.reduce_dtype)
        logger.info("one rank: no FSDP2; %s compute copies cast once per step (mixed_precision.py)", param_dtype)
        return model
    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mp_policy}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    layer_classes = decoder_layer_classes(model, getattr(fsdp_config, "wrap_policy", None))
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        logger.warning("no decoder layers (%s) found to shard one by one; sharding the root only", layer_classes)
    # With one rank nothing is sharded: one parameter group (the root) kept gathered from forward to backward
    # does the same casts with one hook instead of one per layer, and no second gather in backward.
    reshard_after_forward = fsdp_config.reshard_after_forward and mesh.size() > 1
    if mesh.size() == 1:
        layers = []
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kwargs)
    logger.info("FSDP2: %d layers + root sharded over %d ranks (offload=%s)", len(layers), mesh.size(), offload)
    return model


def reshard(model: nn.Module) -> None:
    """Free the root's gathered parameters after a no-grad forward (FSDP2 keeps the root unsharded), or the
    single-rank compute copies after a forward or the last backward of a step (fp32 weights and gradients back)."""
    precision = getattr(model, "single_rank_precision", None)
    if precision is not None:
        precision.reshard()
    elif hasattr(model, "reshard"):
        model.reshard()


def set_gradient_accumulation(model: nn.Module, is_last_micro_batch: bool) -> None:
    """Before each backward of a gradient-accumulation loop: on one rank, gradients are reduced (a copy into the
    fp32 shard) and parameters resharded only after the last micro-batch; the ones before accumulate fp32 gradients
    in place (FSDP2 upcasts to `reduce_dtype`) and keep the bf16 parameters gathered for the next forward. With
    several ranks every micro-batch reduces as usual (accumulating unsharded gradients would cost their full size).
    """
    if not hasattr(model, "set_requires_gradient_sync") or world_size() > 1:
        return
    model.set_requires_gradient_sync(is_last_micro_batch)
    model.set_reshard_after_backward(is_last_micro_batch)


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """(first row, number of rows) of `rank`'s FSDP2 shard of a tensor with `rows` rows (torch.chunk's split:
    ⌈rows / world⌉ rows per rank, the last ranks fewer or none)."""
    slot = -(-rows // world)
    return rank * slot, max(0, min(slot, rows - rank * slot))


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly sharded) parameter: a collective when it is a DTensor over several ranks,
    the local tensor itself over one (no collective, no copy: a weight sync calls this once per parameter)."""
    if not isinstance(tensor, DTensor):
        return tensor
    if tensor.device_mesh.size() == 1:
        local = tensor.to_local()
        if local.shape == tensor.shape:
            return local
    return tensor.full_tensor()


def iter_full_state(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every parameter and persistent buffer, gathered one at a time (all ranks call)."""
    for name, param in model.named_parameters():
        yield name, full_tensor(param.detach())
    persistent = {name for name, _ in model.state_dict().items()}
    for name, buffer in model.named_buffers():
        if name in persistent:
            yield name, full_tensor(buffer.detach())


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move every tensor of the optimizer state (Adam moments, step) to `device` (for optimizer offload)."""
    for state in optimizer.state.values():
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and name != "step":
                state[name] = value.to(device, non_blocking=True)
