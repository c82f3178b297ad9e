"""Weight sync from the trainer's FSDP2 shards to the generation engine, gathered in buckets.

Every rank holds a row shard (`Shard(0)`) of each parameter. Gathering them one parameter at a time costs one
collective per tensor (~290 for a 0.5B Qwen2, ~340 for 7B), each too small to use the link well. Here the local
shards of consecutive parameters are packed into one flat buffer of about `bucket_bytes`, gathered with ONE
`all_gather_into_tensor`, and cut back into full tensors, which the engine loads before the next bucket is
gathered: at most one bucket of full weights exists at a time, never the whole model.

Layout of a bucket (the same on every rank, so ranks can gather without exchanging sizes): for each parameter p
of shape (N, ...) over W ranks, its slot is ceil(N / W) rows × the row size; rank r writes its own rows (FSDP2
gives the last ranks fewer rows, or none) and pads the rest. After the gather, rank r's segment holds its slots;
the full p is the concatenation over ranks of the first `rows_r` rows of each slot.

    stats = SyncStats()
    engine.load_weights(iter_bucketed_state(fsdp_model, bucket_bytes=512 << 20, stats=stats))
    stats.num_bytes, stats.num_buckets, stats.seconds
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from hyflow.workers.fsdp import full_tensor

__all__ = ["DEFAULT_BUCKET_BYTES", "SyncStats", "iter_bucketed_state"]

DEFAULT_BUCKET_BYTES = 256 << 20


@dataclass
class SyncStats:
    """What one sync moved: full-tensor bytes handed to the engine, tensors, gather collectives, and the wall time
    from the first gather to the last tensor consumed (the engine's loading included)."""

    num_bytes: int = 0
    num_tensors: int = 0
    num_buckets: int = 0
    seconds: float = 0.0


def _row_sharded(tensor: torch.Tensor) -> bool:
    """A DTensor sharded by rows over a 1-D mesh of several ranks: the layout FSDP2 gives every parameter."""
    return (
        isinstance(tensor, DTensor)
        and tensor.device_mesh.ndim == 1
        and tensor.device_mesh.size() > 1
        and tuple(tensor.placements) == (Shard(0),)
    )


def _gather_bucket(bucket: list[tuple[str, DTensor]]) -> list[tuple[str, torch.Tensor]]:
    """Full tensors of a bucket of row-sharded parameters (one dtype), with one all-gather."""
    group = bucket[0][1].device_mesh.get_group()
    world = dist.get_world_size(group)
    local_dtype = bucket[0][1].to_local().dtype
    shapes, slots, offset = [], [], 0
    for _, param in bucket:
        rows, row_numel = param.shape[0], math.prod(param.shape[1:])
        slot_rows = -(-rows // world)
        shapes.append((rows, slot_rows, row_numel))
        slots.append(offset)
        offset += slot_rows * row_numel
    device = bucket[0][1].to_local().device
    send = torch.zeros(offset, dtype=local_dtype, device=device)
    for (_, param), start in zip(bucket, slots):
        local = param.to_local().reshape(-1)
        send[start : start + local.numel()].copy_(local)
    received = torch.empty(world * offset, dtype=local_dtype, device=device)
    dist.all_gather_into_tensor(received, send, group=group)
    segments = received.view(world, offset)
    out = []
    for (name, param), (rows, slot_rows, row_numel), start in zip(bucket, shapes, slots):
        pieces = []
        for rank in range(world):
            rank_rows = max(0, min(slot_rows, rows - rank * slot_rows))
            if rank_rows:
                pieces.append(segments[rank, start : start + rank_rows * row_numel])
        out.append((name, torch.cat(pieces).view(param.shape)))
    return out


def iter_bucketed_state(
    model: nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES, stats: SyncStats | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every parameter and persistent buffer, row-sharded ones gathered in buckets of
    about `bucket_bytes` (all ranks call it and consume it in step); anything else goes through `full_tensor`."""
    stats = stats if stats is not None else SyncStats()
    start = time.perf_counter()
    persistent = set(model.state_dict())
    named = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n in persistent]
    bucket: list[tuple[str, DTensor]] = []
    bucket_size = 0

    def flush() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal bucket, bucket_size
        if bucket:
            stats.num_buckets += 1
            yield from _gather_bucket(bucket)
        bucket, bucket_size = [], 0

    for name, tensor in named:
        tensor = tensor.detach()
        if not _row_sharded(tensor):
            yield from _counted(flush(), stats)
            yield from _counted(iter([(name, full_tensor(tensor))]), stats)
            continue
        size = tensor.numel() * tensor.element_size()
        same_kind = not bucket or (bucket[0][1].dtype, bucket[0][1].device_mesh) == (tensor.dtype, tensor.device_mesh)
        if bucket and (bucket_size + size > bucket_bytes or not same_kind):
            yield from _counted(flush(), stats)
        bucket.append((name, tensor))
        bucket_size += size
    yield from _counted(flush(), stats)
    stats.seconds += time.perf_counter() - start


def _counted(items: Iterator[tuple[str, torch.Tensor]], stats: SyncStats) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in items:
        stats.num_tensors += 1
        stats.num_bytes += tensor.numel() * tensor.element_size()
        yield name, tensor
