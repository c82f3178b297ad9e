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
At most one bucket of full weights is in flight, never the whole model.

The backend is chosen when the members join (`channel_backend`): NCCL when every member holds a GPU of its own, so
buckets go device to device and never through host memory; gloo otherwise (CPU runs, or pools that share a GPU,
where NCCL refuses two ranks on one device), with the buckets in host memory. Every member publishes its device
(the GPU's UUID, or "cpu") in the store first, so all of them pick the same backend.
"""

from __future__ import annotations

import datetime
import logging
import pickle
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from hyflow.workers.weight_sync import SyncStats

__all__ = ["WeightChannel", "channel_backend", "device_identity"]

logger = logging.getLogger(__name__)

_ALIGN = 16  # byte offset of every tensor in a bucket, so each slice can be viewed as its dtype


def _aligned(num_bytes: int) -> int:
    return -(-num_bytes // _ALIGN) * _ALIGN


def device_identity() -> str:
    """What this process moves tensors with: its current GPU's UUID, or "cpu" without CUDA."""
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{torch.cuda.get_device_properties(torch.cuda.current_device()).uuid}"


def channel_backend(identities: list[str]) -> str:
    """ "nccl" when every member (its `device_identity`) holds a GPU no other member holds, else "gloo"."""
    on_gpus = all(identity.startswith("cuda:") for identity in identities)
    return "nccl" if on_gpus and len(set(identities)) == len(identities) and dist.is_nccl_available() else "gloo"


class WeightChannel:
    """A process group of training rank 0 (rank 0, the sender) and the rollout workers (1..R, receivers)."""

    def __init__(self, group: Any, rank: int, store: Any, device: torch.device | None = None) -> None:
        self.group, self.rank = group, rank
        self.device = device or torch.device("cpu")  # where buckets live: a GPU on NCCL, host memory on gloo
        self._store = store  # the process group reads its peers through it; keep it alive as long as the group

    @property
    def backend(self) -> str:
        return "gloo" if self.device.type == "cpu" else "nccl"

    @classmethod
    def join(cls, host: str, port: int, rank: int, world_size: int, timeout_s: float = 600.0) -> WeightChannel:
        """Join the channel (blocks until all `world_size` members joined); rank 0 hosts the store at host:port."""
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
        store.set(f"device/{rank}", device_identity())
        backend = channel_backend([store.get(f"device/{r}").decode() for r in range(world_size)])
        group_store = dist.PrefixStore("weights", store)
        if backend == "gloo":
            return cls(dist.ProcessGroupGloo(group_store, rank, world_size, timeout), rank, store)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(group_store, rank, world_size, options)
        if rank == 0:
            logger.info("weight channel on NCCL: %d rollout worker(s), each on a GPU of its own", world_size - 1)
        return cls(group, rank, store, torch.device("cuda", torch.cuda.current_device()))

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def _broadcast_header(self, header: list[tuple[str, torch.dtype, tuple[int, ...]]] | None) -> list:
        payload = pickle.dumps(header) if self.rank == 0 else b""
        size = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        self._broadcast(size)
        if self.rank == 0:
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device)
        else:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)  # a host sync on NCCL
        self._broadcast(data)
        return pickle.loads(data.cpu().numpy().tobytes())

    def _send_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        header = [(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in bucket]
        self._broadcast_header(header)
        num_bytes_total = sum(_aligned(t.numel() * t.element_size()) for _, t in bucket)
        flat = torch.empty(num_bytes_total, dtype=torch.uint8, device=self.device)
        offset = 0
        for _, tensor in bucket:
            num_bytes = tensor.numel() * tensor.element_size()
            flat[offset : offset + num_bytes].copy_(tensor.detach().contiguous().reshape(-1).view(torch.uint8))
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
            num_bytes_total = sum(_aligned(torch.Size(s).numel() * d.itemsize) for _, d, s in header)
            flat = torch.empty(num_bytes_total, dtype=torch.uint8, device=self.device)
            self._broadcast(flat)
            offset = 0
            for name, dtype, shape in header:
                num_bytes = torch.Size(shape).numel() * dtype.itemsize
                yield name, flat[offset : offset + num_bytes].view(dtype).view(shape)
                offset += _aligned(num_bytes)
