"""Weight transfer between resource pools: training rank 0 sends the full weights to every rollout worker.

With split placement (`trainer.placement=split`) the engines live in processes of their own, outside the training
ranks' `torch.distributed` group. A `WeightChannel` is a second, small group just for the weights: rank 0 is
training rank 0, ranks 1..R the R rollout workers, joined through a TCP store at training rank 0's address.

    channel = WeightChannel.join(host, port, rank, world_size)       # every member, at the same time
    stats = channel.send(actor.actor_weights(), bucket_bytes)        # rank 0: full tensors, one bucket at a time
    engine.load_weights(channel.receive())                           # ranks 1..R, in step with the sender

The sender's weights come from `ActorRolloutRefWorker.actor_weights`, which gathers the FSDP2 shards in buckets
(`hyflow.workers.weight_sync`): every training rank runs that gather, only rank 0 sends. Here the full tensors of
consecutive parameters are packed again into one flat byte buffer of about `bucket_bytes` (`pack_bucket`: each
tensor at a 16-byte aligned offset, listed in a header of names, dtypes and shapes), handed to the channel's
transport, and cut back into tensors on every receiver (`unpack_bucket`); an end marker closes the stream. At most
two buckets of full weights are in flight, never the whole model.

The transport is chosen when the members join (`channel_backend`). Every member first publishes its device (the
GPU's UUID, or "cpu") in the store, so all of them pick the same one:
- "ipc": every member on the sender's GPU (`trainer.rollout_shares_devices` on one GPU). The bucket stays in the
  sender's GPU memory; receivers open it through a CUDA IPC handle, copy it out and acknowledge
  (`hyflow.workers.ipc_transfer`). No byte goes through host memory.
- "nccl": every member holds a GPU of its own. One broadcast per bucket, device to device (two small broadcasts
  before it carry the header).
- "gloo": everything else, with the same broadcasts through host memory over TCP. That covers CPU runs, and
  groups that mix members on the sender's GPU with members elsewhere: NCCL refuses two ranks on one device, and
  IPC reaches only the sender's own GPU.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import pickle
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hyflow.workers.ipc_transfer import IPC_SWITCH, CudaIpcSharing, SharedBufferTransport
from hyflow.workers.weight_sync import SyncStats

__all__ = ["IPC_SWITCH", "WeightChannel", "channel_backend", "device_identity", "pack_bucket", "unpack_bucket"]

logger = logging.getLogger(__name__)

_ALIGN = 16  # byte offset of every tensor in a bucket, so each slice can be viewed as its dtype
Header = list[tuple[str, torch.dtype, tuple[int, ...]]]  # a bucket's tensors: name, dtype, shape, in order
_TRANSPORTS = {
    "ipc": "CUDA IPC (every rollout worker on the sender's GPU)",
    "nccl": "NCCL (every member on a GPU of its own)",
    "gloo": "gloo (host memory)",
}


def _aligned(num_bytes: int) -> int:
    return -(-num_bytes // _ALIGN) * _ALIGN


def device_identity() -> str:
    """What this process moves tensors with: its current GPU's UUID, or "cpu" without CUDA."""
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{torch.cuda.get_device_properties(torch.cuda.current_device()).uuid}"


def channel_backend(identities: list[str], allow_ipc: bool = True) -> str:
    """The transport for members with these `device_identity`s (member 0 the sender): "ipc" when `allow_ipc` and
    there are receivers and all of them share the sender's GPU; "nccl" when every member holds a GPU no other member
    holds (and torch has NCCL); "gloo" otherwise (a member without a GPU, members sharing a GPU without IPC, or some
    members sharing a GPU and others not).

    `HYFLOW_WEIGHT_CHANNEL_IPC=0` in training rank 0's environment turns CUDA IPC off (such members then use gloo),
    e.g. to rule it out while debugging. Its protocol is tested on CPU through shared host memory
    (`tests/workers/test_weight_channel_shared_buffers.py`), its CUDA handles on a GPU
    (`tests/workers/test_weight_channel_ipc.py`)."""
    on_gpus = all(identity.startswith("cuda:") for identity in identities)
    if allow_ipc and on_gpus and len(identities) > 1 and len(set(identities)) == 1:
        return "ipc"
    return "nccl" if on_gpus and len(set(identities)) == len(identities) and dist.is_nccl_available() else "gloo"


def pack_bucket(bucket: list[tuple[str, torch.Tensor]], device: torch.device) -> tuple[Header, torch.Tensor]:
    """(header, flat uint8 buffer on `device`) holding the bucket's tensors, each at a 16-byte aligned offset."""
    header = [(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in bucket]
    flat = torch.empty(_bucket_bytes(header), dtype=torch.uint8, device=device)
    offset = 0
    for _, tensor in bucket:
        num_bytes = tensor.numel() * tensor.element_size()
        flat[offset : offset + num_bytes].copy_(tensor.detach().contiguous().reshape(-1).view(torch.uint8))
        offset += _aligned(num_bytes)
    return header, flat


def unpack_bucket(header: Header, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of a packed bucket, in order: views into `flat`."""
    offset = 0
    for name, dtype, shape in header:
        num_bytes = torch.Size(shape).numel() * dtype.itemsize
        yield name, flat[offset : offset + num_bytes].view(dtype).view(shape)
        offset += _aligned(num_bytes)


def _bucket_bytes(header: Header) -> int:
    return sum(_aligned(torch.Size(shape).numel() * dtype.itemsize) for _, dtype, shape in header)


def _buckets(weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list]:
    """Consecutive (name, tensor) pairs in groups of at most `bucket_bytes` (a larger tensor goes alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        num_bytes = tensor.numel() * tensor.element_size()
        if bucket and size + num_bytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += num_bytes
    if bucket:
        yield bucket


class BucketTransport(Protocol):
    """How packed buckets get from the sender to the receivers (`CollectiveTransport`, `SharedBufferTransport`)."""

    backend: str
    device: torch.device  # where this member's bucket buffers live

    def send_bucket(self, header: Header, flat: torch.Tensor) -> None: ...
    def send_end(self) -> None: ...
    def abort(self, reason: str) -> None: ...
    def receive_bucket(self) -> tuple[Header, torch.Tensor] | None: ...  # None: the end marker


class CollectiveTransport:
    """A bucket is three broadcasts in a process group: its header's size, the header, the flat buffer. NCCL keeps
    the buffers on this member's GPU, gloo in host memory."""

    def __init__(self, group: Any, rank: int, device: torch.device) -> None:
        self.group, self.rank, self.device = group, rank, device
        self.backend = "gloo" if device.type == "cpu" else "nccl"

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def _broadcast_header(self, header: Header | None) -> Header:
        payload = pickle.dumps(header) if self.rank == 0 else b""
        size = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        self._broadcast(size)
        if self.rank == 0:
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device)
        else:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)  # a host sync on NCCL
        self._broadcast(data)
        return pickle.loads(data.cpu().numpy().tobytes())

    def send_bucket(self, header: Header, flat: torch.Tensor) -> None:
        self._broadcast_header(header)
        self._broadcast(flat)

    def send_end(self) -> None:
        self._broadcast_header([])

    def abort(self, reason: str) -> None:
        """Nothing to post: the receivers' pending broadcast fails when the group's timeout runs out."""

    def receive_bucket(self) -> tuple[Header, torch.Tensor] | None:
        header = self._broadcast_header(None)
        if not header:
            return None
        flat = torch.empty(_bucket_bytes(header), dtype=torch.uint8, device=self.device)
        self._broadcast(flat)
        return header, flat


class WeightChannel:
    """Training rank 0 (rank 0, the sender) and the rollout workers (ranks 1..R, the receivers), over a transport."""

    def __init__(self, transport: BucketTransport, rank: int, store: Any) -> None:
        self.transport, self.rank = transport, rank
        self._store = store  # the transport reads its peers through it; keep it alive as long as the channel

    @property
    def backend(self) -> str:
        return self.transport.backend

    @property
    def device(self) -> torch.device:
        return self.transport.device

    @classmethod
    def join(cls, host: str, port: int, rank: int, world_size: int, timeout_s: float = 600.0) -> WeightChannel:
        """Join the channel (blocks until all `world_size` members joined); rank 0 hosts the store at host:port."""
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
        store.set(f"device/{rank}", device_identity())
        if rank == 0:  # the sender decides for every member, so they agree whatever their environments
            identities = [store.get(f"device/{r}").decode() for r in range(world_size)]
            backend = channel_backend(identities, allow_ipc=os.environ.get(IPC_SWITCH, "1") != "0")
            store.set("backend", backend)
            logger.info("weight channel on %s: %d rollout worker(s)", _TRANSPORTS[backend], world_size - 1)
        else:
            backend = store.get("backend").decode()
        if backend == "ipc":
            device = torch.device("cuda", torch.cuda.current_device())
            return cls(SharedBufferTransport(store, rank, world_size, CudaIpcSharing(), timeout_s, device), rank, store)
        group_store = dist.PrefixStore("weights", store)
        if backend == "gloo":
            group = dist.ProcessGroupGloo(group_store, rank, world_size, timeout)
            return cls(CollectiveTransport(group, rank, torch.device("cpu")), rank, store)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(group_store, rank, world_size, options)
        return cls(CollectiveTransport(group, rank, torch.device("cuda", torch.cuda.current_device())), rank, store)

    def send(self, weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> SyncStats:
        """Rank 0: send every (name, full tensor) of `weights`, packed in buckets of about `bucket_bytes`; returns
        once the transport is done with every bucket."""
        assert self.rank == 0, "only rank 0 (training rank 0) sends"
        stats, start = SyncStats(), time.perf_counter()
        try:
            for bucket in _buckets(weights, bucket_bytes):
                self.transport.send_bucket(*pack_bucket(bucket, self.device))
                stats.num_buckets += 1
                stats.num_tensors += len(bucket)
                stats.num_bytes += sum(tensor.numel() * tensor.element_size() for _, tensor in bucket)
            self.transport.send_end()
        except BaseException as error:
            with contextlib.suppress(Exception):  # best effort: the error raised is the original one
                self.transport.abort(f"{type(error).__name__}: {error}")
            raise
        stats.seconds = time.perf_counter() - start
        return stats

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Ranks 1..R: (name, full tensor) as rank 0 sends them, one bucket at a time, until the end marker."""
        while (bucket := self.transport.receive_bucket()) is not None:
            yield from unpack_bucket(*bucket)
