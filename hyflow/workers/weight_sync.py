"""Weight sync from the trainer's FSDP2 shards to the generation engine, streamed in buckets.

Every rank holds a row shard (`Shard(0)`) of each parameter: of N rows over W ranks, rank s holds rows
s·⌈N/W⌉ .. on (the last ranks fewer, or none). Gathering one parameter at a time costs one collective per tensor
(~290 for a 0.5B Qwen2, ~340 for 7B), each too small to use the link well. Here the local shards of consecutive
parameters are packed into one flat buffer of about `bucket_bytes` and moved with ONE collective, chosen by what
the engines need:

- one engine per rank (no tensor parallelism): every rank needs every full tensor, so a bucket is one
  all-gather. Its layout is the same on every rank (no sizes exchanged): parameter p's slot is
  ⌈N/W⌉ rows × the row size, rank s writes its rows and pads the rest, and the full p is the concatenation over
  ranks of the first rows_s rows of each slot. Each rank receives the whole model.
- engines split over TP groups of tp ranks (`tp_slices`): rank d, TP rank t = d mod tp of its engine, needs only
  its `TensorSlice` of each column- or row-parallel weight (parallel.py). A bucket is one `all_to_all`: sender s
  sends rank d the rows of its shard that fall inside d's slice (a dim-0 slice), or all its rows cut to d's
  columns (a dim-1 slice), or all its rows (a tensor every rank holds whole); rank d concatenates what the senders
  sent, in rank order, into its slice. Every split size follows from the shapes, so no sizes are exchanged. Each
  rank receives about 1/tp of the sliced weights and never holds a full copy of one.

Streaming: bucket k+1's collective is launched (`async_op`) before bucket k's tensors are handed to the engine, so
the transfer of the next bucket overlaps the engine's copies of this one; at most two buckets are in flight.

    stats = SyncStats()
    engine.load_weights(iter_bucketed_state(fsdp_model, bucket_bytes=512 << 20, stats=stats, tp_slices=slices))
    stats.metrics()     # rollout/weight_sync_gb, _comm_gb, _buckets, _wait_s, _s
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from hyflow.engine.parallel import EnginePlacement, TensorSlice, all_gather_single
from hyflow.workers.fsdp import full_tensor, shard_rows

__all__ = ["DEFAULT_BUCKET_BYTES", "SliceFn", "SyncStats", "iter_bucketed_state"]

DEFAULT_BUCKET_BYTES = 256 << 20
# A parameter name of the trained module -> the slice each TP rank of an engine holds (by TP rank; None where a
# rank holds all of it), or None when every rank holds the whole tensor.
SliceFn = Callable[[str], Sequence[TensorSlice | None] | None]


@dataclass
class SyncStats:
    """What one sync moved, on this rank: bytes handed to the engine (full tensors or this rank's slices) and
    tensors, collectives (buckets) and the bytes they brought in (padding and this rank's own part included), the
    host time spent waiting for a collective (the part the overlap did not hide; on CUDA the wait is the stream's,
    so this stays small and `seconds` holds it), and the wall time of the whole sync, the engine's loading included."""

    num_bytes: int = 0
    num_tensors: int = 0
    num_buckets: int = 0
    comm_bytes: int = 0
    wait_seconds: float = 0.0
    seconds: float = 0.0

    def metrics(self, prefix: str = "rollout/weight_sync") -> dict[str, float]:
        return {
            f"{prefix}_gb": self.num_bytes / 1e9,
            f"{prefix}_comm_gb": self.comm_bytes / 1e9,
            f"{prefix}_buckets": float(self.num_buckets),
            f"{prefix}_wait_s": self.wait_seconds,
            f"{prefix}_s": self.seconds,
        }


def _row_sharded(tensor: torch.Tensor) -> bool:
    """A DTensor sharded by rows over a 1-D mesh of several ranks: the layout FSDP2 gives every parameter."""
    return (
        isinstance(tensor, DTensor)
        and tensor.device_mesh.ndim == 1
        and tensor.device_mesh.size() > 1
        and tuple(tensor.placements) == (Shard(0),)
    )


class _Collective:
    """One bucket's collective, launched at construction (async) and cut into tensors by `finish`."""

    def __init__(self, bucket: list[tuple[str, DTensor]], dtype: torch.dtype | None) -> None:
        self.bucket = bucket
        self.group = bucket[0][1].device_mesh.get_group()
        self.world, self.rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        local = bucket[0][1].to_local()
        self.dtype, self.device = dtype or local.dtype, local.device

    def finish(self, stats: SyncStats) -> list[tuple[str, torch.Tensor]]:
        start = time.perf_counter()
        self.work.wait()
        stats.wait_seconds += time.perf_counter() - start
        stats.num_buckets += 1
        stats.comm_bytes += self.received.numel() * self.received.element_size()
        return self.cut()


class _Gather(_Collective):
    """Every full tensor of a bucket on every rank: one all-gather of fixed-size slots (the module docstring)."""

    def __init__(self, bucket: list[tuple[str, DTensor]], dtype: torch.dtype | None) -> None:
        super().__init__(bucket, dtype)
        self.slots, offset = [], 0
        for _, param in bucket:
            slot_numel = -(-param.shape[0] // self.world) * math.prod(param.shape[1:])
            self.slots.append((offset, slot_numel))
            offset += slot_numel
        send = torch.zeros(offset, dtype=self.dtype, device=self.device)
        for (_, param), (start, _) in zip(bucket, self.slots):
            local = param.to_local().reshape(-1)
            send[start : start + local.numel()].copy_(local)
        self.received = torch.empty(self.world * offset, dtype=self.dtype, device=self.device)
        self.work = all_gather_single(self.received, send, group=self.group, async_op=True)

    def cut(self) -> list[tuple[str, torch.Tensor]]:
        segments = self.received.view(self.world, -1)
        out = []
        for (name, param), (start, _) in zip(self.bucket, self.slots):
            row_numel = math.prod(param.shape[1:])
            pieces = []
            for rank in range(self.world):
                rows = shard_rows(param.shape[0], self.world, rank)[1]
                if rows:
                    pieces.append(segments[rank, start : start + rows * row_numel])
            out.append((name, torch.cat(pieces).view(param.shape)))
        return out


class _Scatter(_Collective):
    """Each rank's TP slices of a bucket's tensors: one all-to-all (the module docstring).

    `slices[i]` is parameter i's slice by TP rank (None: whole on every rank); rank d holds TP rank d mod tp."""

    def __init__(
        self,
        bucket: list[tuple[str, DTensor]],
        dtype: torch.dtype | None,
        slices: list[Sequence[TensorSlice | None] | None],
    ) -> None:
        super().__init__(bucket, dtype)
        self.slices = slices
        tp_size = len(next(s for s in slices if s is not None))  # a bucket with a sliced tensor comes here
        self.placement = EnginePlacement(self.world, tp_size)
        count = len(bucket)
        send_sizes = [sum(self._numel(i, self.rank, dest) for i in range(count)) for dest in range(self.world)]
        # receive_numels[s][i]: elements of parameter i that sender s sends this rank
        self.receive_numels = [[self._numel(i, s, self.rank) for i in range(count)] for s in range(self.world)]
        receive_sizes = [sum(numels) for numels in self.receive_numels]
        send, offset = torch.empty(sum(send_sizes), dtype=self.dtype, device=self.device), 0
        for dest in range(self.world):
            for index in range(count):
                piece = self._piece(index, dest)
                send[offset : offset + piece.numel()].view(piece.shape).copy_(piece)  # casts to the engine's dtype
                offset += piece.numel()
        self.received = torch.empty(sum(receive_sizes), dtype=self.dtype, device=self.device)
        self.work = dist.all_to_all_single(
            self.received, send, receive_sizes, send_sizes, group=self.group, async_op=True
        )

    def _slice(self, index: int, dest: int) -> TensorSlice | None:
        by_tp_rank = self.slices[index]
        return None if by_tp_rank is None else by_tp_rank[self.placement.tp_rank_of(dest)]

    def _rows(self, index: int, sender: int, dest: int) -> tuple[int, int, TensorSlice | None]:
        """(first row, rows) of the sender's shard that `dest` receives, and the columns it keeps (a dim-1 slice)."""
        shape, piece = self.bucket[index][1].shape, self._slice(index, dest)
        first, rows = shard_rows(shape[0], self.world, sender)
        if piece is None or piece.dim == 1:
            return first, rows, piece
        assert piece.dim == 0, f"TP slices cut dim 0 or 1, not {piece.dim}"
        low, high = max(first, piece.start), min(first + rows, piece.start + piece.length)
        return low, max(0, high - low), None

    def _numel(self, index: int, sender: int, dest: int) -> int:
        shape = self.bucket[index][1].shape
        _, rows, columns = self._rows(index, sender, dest)
        width = math.prod(shape[1:]) if columns is None else math.prod(columns.shape(shape)[1:])
        return rows * width

    def _piece(self, index: int, dest: int) -> torch.Tensor:
        """The part of this rank's shard of parameter `index` that `dest` receives (a view)."""
        param = self.bucket[index][1]
        first, rows, columns = self._rows(index, self.rank, dest)
        own_first = shard_rows(param.shape[0], self.world, self.rank)[0]
        piece = param.to_local().narrow(0, first - own_first, rows) if rows else param.to_local()[:0]
        return piece if columns is None else columns.take(piece)

    def cut(self) -> list[tuple[str, torch.Tensor]]:
        """Rank d's slice of each parameter: the senders' parts concatenated along dim 0, in rank order."""
        parts: list[list[torch.Tensor]] = [[] for _ in self.bucket]
        offset = 0
        for numels in self.receive_numels:  # the received buffer: sender by sender, parameter by parameter
            for index, numel in enumerate(numels):
                if numel:
                    parts[index].append(self.received[offset : offset + numel])
                offset += numel
        out = []
        for index, (name, param) in enumerate(self.bucket):
            piece = self._slice(index, self.rank)
            shape = tuple(param.shape) if piece is None else piece.shape(param.shape)
            whole = parts[index][0] if len(parts[index]) == 1 else torch.cat(parts[index])  # one sender: no copy
            out.append((name, whole.view(shape)))
        return out


def _plan(model: nn.Module, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The model's parameters and persistent buffers in module order, grouped: a bucket of row-sharded tensors of
    one dtype and mesh of about `bucket_bytes`, or a list of one tensor of any other kind."""
    persistent = set(model.state_dict())
    named = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n in persistent]
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        tensor = tensor.detach()
        if not _row_sharded(tensor):
            if bucket:
                yield bucket
            bucket, size = [], 0
            yield [(name, tensor)]
            continue
        nbytes = tensor.numel() * tensor.element_size()
        same_kind = not bucket or (bucket[0][1].dtype, bucket[0][1].device_mesh) == (tensor.dtype, tensor.device_mesh)
        if bucket and (size + nbytes > bucket_bytes or not same_kind):
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def _launch(
    group: list[tuple[str, torch.Tensor]], tp_slices: SliceFn | None, dtype: torch.dtype | None
) -> _Collective | None:
    """The started collective of a bucket, or None for a tensor that is not row-sharded."""
    if not _row_sharded(group[0][1]):
        return None
    slices = [] if tp_slices is None else [tp_slices(name) for name, _ in group]
    if all(piece is None for piece in slices):  # every rank needs every tensor of this bucket whole
        return _Gather(group, dtype)
    return _Scatter(group, dtype, slices)


def iter_bucketed_state(
    model: nn.Module,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    stats: SyncStats | None = None,
    tp_slices: SliceFn | None = None,
    dtype: torch.dtype | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every parameter and persistent buffer: full tensors, or with `tp_slices` (engines split
    over TP groups of consecutive ranks) this rank's slice of each sliced weight. Row-sharded tensors move in
    buckets of about `bucket_bytes` (of the model's dtype), cast to `dtype` when given (the engine's: fp32 master
    weights for a bf16 engine move half the bytes), the next bucket's collective in flight while this one is
    consumed; anything else goes through `full_tensor` as it is (the engine's copy casts it). All ranks call it
    and consume it in step."""
    stats = stats if stats is not None else SyncStats()
    start = time.perf_counter()
    pending: _Collective | None = None  # the latest bucket launched, not yet handed over
    try:
        for group in _plan(model, bucket_bytes):
            previous, pending = pending, _launch(group, tp_slices, dtype)  # the next bucket moves while this one loads
            if previous is not None:
                yield from _counted(previous.finish(stats), stats)
            if pending is None:
                name, tensor = group[0]
                yield from _counted([(name, full_tensor(tensor))], stats)
        if pending is not None:
            previous, pending = pending, None
            yield from _counted(previous.finish(stats), stats)
    finally:
        if pending is not None:  # the consumer stopped early: no collective is left running on the group
            pending.work.wait()
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # the engine's copies of the last bucket belong to the sync's time
    stats.seconds += time.perf_counter() - start


def _counted(items: list[tuple[str, torch.Tensor]], stats: SyncStats) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in items:
        stats.num_tensors += 1
        stats.num_bytes += tensor.numel() * tensor.element_size()
        yield name, tensor
