"""nd-compute dispatch: one chunk of the batch per data-parallel rank of a device mesh, not per worker.

With tensor (or pipeline) parallelism several workers hold one data-parallel replica; they must see the same rows,
and only one of them should hand its result back. Each worker says where it stands, per mesh name, in `__init__`:

    self._register_dispatch_collect_info(mesh_name="train", dp_rank=mesh["dp"].get_local_rank(),
                                         is_collect=mesh["tp"].get_local_rank() == 0)

and a method opts in with

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"))
    def update(self, data: DataProto) -> DataProto: ...

Dispatch (in the controller): on the group's first call for that mesh, it asks every worker for its dp rank and
collect flag (`_query_dispatch_info` / `_query_collect_info`, cached in the group's `_dispatch_info` /
`_collect_info`), cuts each `DataProto`, `DataProtoFuture` or `TensorDict` argument into `dp_size = max(dp_rank) + 1`
chunks (the rows must divide, as `DataProto.chunk` says, unless auto padding is on) and gives every worker the chunk
of its dp rank; other arguments go to every worker. Collect: the results of the collecting workers, one per dp rank,
joined in dp-rank order (`DataProto.concat`, `torch.cat` for TensorDicts; other results as a list).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from tensordict import TensorDict

from hyflow.protocol import DataProto, DataProtoFuture

__all__ = ["collect_nd_compute_dataproto", "dispatch_nd_compute_dataproto", "make_nd_compute_dataproto_dispatch_fn"]


def _dispatch_info(worker_group: Any, mesh_name: str) -> list[int]:
    """Each worker's dp rank in `mesh_name` (asked once, then cached on the group)."""
    if mesh_name not in worker_group._dispatch_info:
        dp_ranks = list(worker_group._query_dispatch_info(mesh_name))
        if sorted(set(dp_ranks)) != list(range(max(dp_ranks) + 1)):
            raise ValueError(
                f"mesh {mesh_name!r}: the workers registered dp ranks {dp_ranks} (by global rank); every dp rank from "
                f"0 to {max(dp_ranks)} needs at least one worker. Check the dp_rank each worker passes to "
                "_register_dispatch_collect_info."
            )
        worker_group._dispatch_info[mesh_name] = dp_ranks
    if mesh_name not in worker_group._collect_info:
        worker_group._collect_info[mesh_name] = [bool(c) for c in worker_group._query_collect_info(mesh_name)]
    return worker_group._dispatch_info[mesh_name]


def _chunk(name: str, value: Any, dp_size: int) -> list:
    """`dp_size` row chunks of a batch-like value."""
    if isinstance(value, (DataProto, DataProtoFuture)):
        return value.chunk(dp_size)
    if isinstance(value, TensorDict):
        rows = value.batch_size[0] if value.batch_size else 0
        if rows % dp_size:
            raise ValueError(
                f"nd-compute dispatch: {name} is a TensorDict of {rows} rows, which do not divide into {dp_size} "
                "data-parallel chunks. Pass a multiple of the dp size (pad the batch first)."
            )
        return list(value.split(rows // dp_size))
    return [value] * dp_size


def dispatch_nd_compute_dataproto(mesh_name: str, worker_group: Any, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """Chunk every batch argument per dp rank of `mesh_name`; worker r gets the chunk of its dp rank."""
    dp_ranks = _dispatch_info(worker_group, mesh_name)
    dp_size = max(dp_ranks) + 1

    def per_worker(name: str, value: Any) -> list:
        chunks = _chunk(name, value, dp_size)
        return [chunks[dp_rank] for dp_rank in dp_ranks]

    split_args = tuple(per_worker(f"argument {i}", a) for i, a in enumerate(args))
    return split_args, {k: per_worker(repr(k), v) for k, v in kwargs.items()}


def _join(outputs: list) -> Any:
    first = outputs[0] if outputs else None
    if isinstance(first, DataProto):
        return DataProto.concat(outputs)
    if isinstance(first, TensorDict):
        return torch.cat(outputs, dim=0)
    return list(outputs)


def collect_nd_compute_dataproto(mesh_name: str, worker_group: Any, outputs: list) -> Any:
    """The collecting workers' results, one per dp rank, joined in dp-rank order."""
    if mesh_name not in worker_group._dispatch_info or mesh_name not in worker_group._collect_info:
        raise ValueError(
            f"collect for mesh {mesh_name!r} before its dispatch: the group knows meshes "
            f"{sorted(worker_group._dispatch_info)}. Use make_nd_compute_dataproto_dispatch_fn, which pairs both."
        )
    dp_ranks = worker_group._dispatch_info[mesh_name]
    collect = worker_group._collect_info[mesh_name]
    by_dp_rank: dict[int, Any] = {}
    for rank, (dp_rank, is_collect, output) in enumerate(zip(dp_ranks, collect, outputs, strict=True)):
        if not is_collect:
            continue
        if dp_rank in by_dp_rank:
            raise ValueError(
                f"mesh {mesh_name!r}: two workers of dp rank {dp_rank} are marked is_collect (rank {rank} and an "
                "earlier one); mark exactly one worker per dp rank (e.g. tp_rank == 0)."
            )
        by_dp_rank[dp_rank] = output
    missing = sorted(set(dp_ranks) - set(by_dp_rank))
    if missing:
        raise ValueError(
            f"mesh {mesh_name!r}: no worker of dp rank(s) {missing} is marked is_collect, so their rows would be "
            "lost; mark exactly one worker per dp rank."
        )
    return _join([by_dp_rank[dp_rank] for dp_rank in sorted(by_dp_rank)])


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict[str, Any]:
    """The `{"dispatch_fn", "collect_fn"}` pair of nd-compute dispatch over the mesh `mesh_name` (verl's name)."""
    return {
        "dispatch_fn": functools.partial(dispatch_nd_compute_dataproto, mesh_name),
        "collect_fn": functools.partial(collect_nd_compute_dataproto, mesh_name),
    }
