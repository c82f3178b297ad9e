"""Weight transfer between resource pools: training rank 0 broadcasts the full weights to every rollout worker.

With split placement (`trainer.placement=split`) the engines live in processes of their own, outside the training
ranks' `torch.distributed` group. A `WeightChannel` is a second, small process group just for the weights: rank 0
is training rank 0, ranks 1..R the R rollout workers, joined through a TCP store at training rank 0's address.

    channel = WeightChannel.join(host, port, rank, world_size)       # every member, at the same time
    stats = channel.send(actor.actor_weights(), bucket_bytes)        # rank 0: full tensors, one bucket at a time
    engine.load_weights(channel.receive())                           # ranks 1..R, in step with the sender

The sender's weights come from `ActorRolloutRefWorker.actor_weights`, which gathers the FSDP2 shards in buckets
(`hyflow.workers.weight_sync`): every training rank runs that gather, only rank 0 sends. Here the full tensors of
consecutive parameters are packed again into one flat byte buffer of about `bucket_bytes` and broadcast with one
collective (two small ones before it carry the bucket's names, dtypes and shapes); an empty bucket ends the stream.
At most one bucket of full weights is in flight, never the whole model. The channel runs over gloo: on CPU that is
the only choice, on GPU the bucket goes through host memory (an NCCL channel is future work).
"""

from __future__ import annotations

import datetime
import pickle
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from hyflow.workers.weight_sync import SyncStats

__all__ = ["WeightChannel"]

_ALIGN = 16  # byte offset of every tensor in a bucket, so each slice can be viewed as its dtype


def _aligned(num_bytes: int) -> int:
    return -(-num_bytes // _ALIGN) * _ALIGN


class WeightChannel:
    """A process group of training rank 0 (rank 0, the sender) and the rollout workers (1..R, receivers)."""

    def __init__(self, group: Any, rank: int, store: Any) -> None:
        self.group, self.rank = group, rank
        self._store = store  # the process group reads its peers through it; keep it alive as long as the group

    @classmethod
    def join(cls, host: str, port: int, rank: int, world_size: int, timeout_s: float = 600.0) -> WeightChannel:
        """Join the channel (blocks until all `world_size` members joined); rank 0 hosts the store at host:port."""
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
        return cls(dist.ProcessGroupGloo(store, rank, world_size, timeout), rank, store)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def _broadcast_header(self, header: list[tuple[str, torch.dtype, tuple[int, ...]]] | None) -> list:
        payload = pickle.dumps(header) if self.rank == 0 else b""
        size = torch.tensor([len(payload)], dtype=torch.int64)
        self._broadcast(size)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if self.rank == 0 else None
        if data is None:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(data)
        return pickle.loads(data.numpy().tobytes())

    def _send_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        header = [(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in bucket]
        self._broadcast_header(header)
        flat = torch.empty(sum(_aligned(t.numel() * t.element_size()) for _, t in bucket), dtype=torch.uint8)
        offset = 0
        for _, tensor in bucket:
            num_bytes = tensor.numel() * tensor.element_size()
            flat[offset : offset + num_bytes].copy_(tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8))
            offset += _aligned(num_bytes)
        self._broadcast(flat)

    def send(self, weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> SyncStats:
        """Rank 0: broadcast every (name, full tensor) of `weights`, packed in buckets of about `bucket_bytes`."""
        assert self.rank == 0, "only rank 0 (training rank 0) sends"
        stats, start = SyncStats(), time.perf_counter()
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in weights:
            num_bytes = tensor.numel() * tensor.element_size()
            if bucket and size + num_bytes > bucket_bytes:
                self._send_bucket(bucket)
                stats.num_buckets += 1
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += num_bytes
            stats.num_tensors += 1
            stats.num_bytes += num_bytes
        if bucket:
            self._send_bucket(bucket)
            stats.num_buckets += 1
        self._broadcast_header([])  # the end of the stream
        stats.seconds = time.perf_counter() - start
        return stats

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Ranks 1..R: (name, full tensor) as rank 0 sends them, one bucket at a time, until the end marker."""
        while True:
            header = self._broadcast_header(None)
            if not header:
                return
            flat = torch.empty(
                sum(_aligned(torch.Size(s).numel() * d.itemsize) for _, d, s in header), dtype=torch.uint8
            )
            self._broadcast(flat)
            offset = 0
            for name, dtype, shape in header:
                num_bytes = torch.Size(shape).numel() * dtype.itemsize
                yield name, flat[offset : offset + num_bytes].view(dtype).view(shape)
                offset += _aligned(num_bytes)
