"""The weight channel's CUDA IPC transport: buckets stay in the sender's GPU memory, and receivers on the same GPU
read them through IPC handles.

`hyflow.workers.pool_transfer.WeightChannel` uses it when every member shares the sender's GPU (`channel_backend`
"ipc", e.g. `trainer.rollout_shares_devices` on one GPU), the way verl, vLLM and SGLang update colocated engines.
NCCL refuses two ranks on one device, and gloo would take every byte through host memory and TCP; here only a
small message travels, through the channel's TCP store:

1. The sender packs a bucket into a GPU buffer (`pack_bucket`), takes one handle to it per receiver
   (`torch.multiprocessing.reductions.reduce_tensor`: the allocation's cudaIpcMemHandle and offset, a reference
   counter, and an IPC event recorded after the packing copies) and posts the bucket's header (names, dtypes,
   shapes) with the handles under `bucket/<seq>`.
2. Each receiver rebuilds a view of the sender's buffer (`rebuild_cuda_tensor`; its stream waits for that event),
   copies it into a buffer of its own, waits for the copy, drops the view and acknowledges under `ack/<seq>/<rank>`
   ("ok", or the error it met). From then on its copy is independent of the sender's buffer.
3. Double buffering with per-bucket acks: right after posting bucket k+1 the sender waits for every ack of bucket
   k, then frees k's buffer. So receivers copy bucket k while the sender gathers and packs k+1, and the sender
   never holds more than two buckets. The end marker is acknowledged too: `send_end` returns once every receiver
   holds every bucket.

Failures become errors that name the member. A receiver that dies or hangs mid-bucket never acks: the sender's
wait ends after the channel's timeout with a TimeoutError naming it. A receiver that cannot open a handle acks
with its error, and the sender raises that error at once. A sender that fails posts an abort, so receivers raise
at once instead of waiting out the timeout.

`SharedBufferTransport` runs this protocol over any `sharing` object with `share(flat, n)` and `copy(handle, device)`:
`CudaIpcSharing` here, or a host shared-memory stand-in with which the CPU tests run the same protocol.
"""

from __future__ import annotations

import collections
import datetime
import inspect
import pickle
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

__all__ = ["IPC_SWITCH", "CudaIpcSharing", "SharedBufferTransport"]

_OK = b"ok"
IPC_SWITCH = "HYFLOW_WEIGHT_CHANNEL_IPC"  # "0" in training rank 0's environment: no CUDA IPC (pool_transfer.py)
_BUFFERS = 2  # buckets the sender holds at most: one being copied by the receivers, one being packed
_DEVICE_ARG = list(inspect.signature(rebuild_cuda_tensor).parameters).index("storage_device")


class CudaIpcSharing:
    """Buffers in the sender's GPU memory, opened by receivers on the same GPU through CUDA IPC handles."""

    def share(self, flat: torch.Tensor, num_receivers: int) -> list[tuple]:
        """One handle per receiver. Each `reduce_tensor` call takes a reference that its receiver gives back when
        it drops its view, so the caching allocator reuses the memory only after every receiver has dropped it."""
        return [reduce_tensor(flat)[1] for _ in range(num_receivers)]

    def copy(self, handle: tuple, device: torch.device) -> torch.Tensor:
        """A copy of the shared buffer on `device` (the sender's GPU: one UUID, maybe another index in this
        process), finished: the sender may reuse its buffer once this returns."""
        args = list(handle)
        args[_DEVICE_ARG] = device.index
        with torch.cuda.device(device):  # the caller may be a worker thread, on another current device
            try:
                shared = rebuild_cuda_tensor(*args)  # this stream waits for the sender's packing copies
            except Exception as error:  # CUDA raises RuntimeError; a driver or container without IPC, others
                raise RuntimeError(
                    f"weight channel (CUDA IPC): cannot open the sender's buffer on {device} through its CUDA IPC "
                    f"handle ({type(error).__name__}: {error}); this GPU, driver or container does not share memory "
                    f"between processes. Set {IPC_SWITCH}=0 in training rank 0's environment to send the weights "
                    "over gloo instead"
                ) from error
            own = shared.clone()
            torch.cuda.current_stream().synchronize()  # deliberate host sync: the copy is done before we ack
        return own


class SharedBufferTransport:
    """Buckets handed over as handles to the sender's buffer, acknowledged one by one (the module docstring)."""

    backend = "ipc"

    def __init__(
        self, store: Any, rank: int, world_size: int, sharing: Any, timeout_s: float, device: torch.device
    ) -> None:
        self.store = dist.PrefixStore("ipc", store)
        self.rank, self.sharing, self.device, self.timeout_s = rank, sharing, device, timeout_s
        self.receivers = list(range(1, world_size))  # channel ranks: rollout worker r is channel rank 1 + r
        self._seq = 0  # the next message, counted alike on every member
        self._in_flight: collections.deque[tuple[int, torch.Tensor | None]] = collections.deque()

    # ---- the sender (channel rank 0) ----
    def send_bucket(self, header: list, flat: torch.Tensor) -> None:
        handles = self.sharing.share(flat, len(self.receivers))
        self._post(("bucket", header, handles), flat)
        if len(self._in_flight) == _BUFFERS:  # bucket k+1 is posted: free bucket k once every receiver copied it
            self._await_acks(*self._in_flight.popleft())

    def send_end(self) -> None:
        """The end marker; returns once every receiver acknowledged every bucket and the marker."""
        self._post(("end",), None)
        while self._in_flight:
            self._await_acks(*self._in_flight.popleft())

    def abort(self, reason: str) -> None:
        """Tell the receivers, waiting for the next message, that the sender failed (`reason`)."""
        self.store.set(f"bucket/{self._seq}", pickle.dumps(("abort", reason)))

    def _post(self, message: tuple, flat: torch.Tensor | None) -> None:
        self.store.set(f"bucket/{self._seq}", pickle.dumps(message))
        self._in_flight.append((self._seq, flat))  # the buffer stays alive until its acks are in
        self._seq += 1

    def _await_acks(self, seq: int, flat: torch.Tensor | None) -> None:
        keys = [f"ack/{seq}/{rank}" for rank in self.receivers]
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except dist.DistError as error:
            missing = [rank for rank, key in zip(self.receivers, keys) if not self.store.check([key])]
            raise TimeoutError(
                f"weight channel (CUDA IPC): {_members(missing)} did not acknowledge bucket {seq} within "
                f"{self.timeout_s:g} s: the process died or hangs (see its log). The limit is the channel's "
                "timeout_s (join_weight_channel)."
            ) from error
        replies = self.store.multi_get(keys)
        for key in [f"bucket/{seq}", *keys]:
            self.store.delete_key(key)
        del flat  # every receiver holds its own copy: the buffer goes back to the caching allocator
        failed = [
            f"{_members([rank])}: {reply.decode()}" for rank, reply in zip(self.receivers, replies) if reply != _OK
        ]
        if failed:
            raise RuntimeError(f"weight channel (CUDA IPC): bucket {seq} failed on " + "; ".join(failed))

    # ---- the receivers (channel ranks 1..R) ----
    def receive_bucket(self) -> tuple[list, torch.Tensor] | None:
        """The next bucket's (header, own copy of its buffer), acknowledged; None at the end marker."""
        seq = self._seq
        self._seq += 1
        message = self._read(seq)
        if message[0] == "end":
            self._ack(seq, _OK)
            return None
        if message[0] == "abort":
            raise RuntimeError(
                f"weight channel (CUDA IPC): the sender (training rank 0) failed before bucket {seq}: {message[1]} "
                "(its log has the traceback)"
            )
        _, header, handles = message
        try:
            flat = self.sharing.copy(handles[self.receivers.index(self.rank)], self.device)
        except Exception as error:
            self._ack(seq, f"{type(error).__name__}: {error}".encode())
            raise
        self._ack(seq, _OK)
        return header, flat

    def _read(self, seq: int) -> tuple:
        try:
            return pickle.loads(self.store.get(f"bucket/{seq}"))
        except dist.DistError as error:
            raise TimeoutError(
                f"weight channel (CUDA IPC): {_members([self.rank])} got no bucket {seq} from the sender (training "
                f"rank 0) within {self.timeout_s:g} s: it died or hangs (see its log)."
            ) from error

    def _ack(self, seq: int, reply: bytes) -> None:
        self.store.set(f"ack/{seq}/{self.rank}", reply)


def _members(ranks: list[int]) -> str:
    """Channel ranks named as the rollout workers they are."""
    return ", ".join(f"rollout worker {rank - 1} (channel rank {rank})" for rank in ranks)
