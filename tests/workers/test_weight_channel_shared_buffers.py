"""The weight channel's shared-buffer protocol (the CUDA IPC transport's), run on CPU: the same
`SharedBufferTransport`, with buckets in host shared memory instead of GPU memory. Receivers get every tensor bit for
bit, the sender keeps each buffer alive until every receiver has copied it and holds at most two, and a receiver
that dies or fails mid-stream fails the sender with an error naming it, while the others learn of it at once."""

import datetime
import os
import time
import weakref

import pytest
import torch
import torch.distributed as dist

from hyflow.controller.worker import free_port
from hyflow.workers.ipc_transfer import SharedBufferTransport
from hyflow.workers.pool_transfer import WeightChannel

from .distributed import run_ranks
from .test_pool_transfer import weights

pytestmark = pytest.mark.multiproc


class HostMemorySharing:
    """`CudaIpcSharing`'s stand-in on CPU: the buffer moves to host shared memory (torch's file-system sharing),
    which is unlinked when the sender frees it, so a receiver that comes too late fails to open it."""

    def share(self, flat: torch.Tensor, num_receivers: int) -> list:
        return [flat.untyped_storage()._share_filename_cpu_()] * num_receivers

    def copy(self, handle, device) -> torch.Tensor:
        shared = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared_filename_cpu(*handle))
        return shared.clone()


class SlowSharing(HostMemorySharing):
    """Receivers that copy each bucket only after a pause; the sender records how many buffers it holds."""

    def __init__(self) -> None:
        self.buffers: list[weakref.ref] = []
        self.most_held = 0

    def share(self, flat, num_receivers):
        self.buffers.append(weakref.ref(flat))
        self.most_held = max(self.most_held, sum(buffer() is not None for buffer in self.buffers))
        return super().share(flat, num_receivers)

    def copy(self, handle, device):
        time.sleep(0.2)
        return super().copy(handle, device)


class DyingSharing(HostMemorySharing):
    def copy(self, handle, device):
        os._exit(3)  # the receiver's process dies holding the bucket, before it acknowledges


class BrokenSharing(HostMemorySharing):
    def copy(self, handle, device):
        raise OSError("cannot open the buffer's handle")


def shared_memory_channel(rank: int, port: int, world_size: int, sharing, ack_timeout_s: float = 120.0):
    """A `WeightChannel` over shared host memory. The sender waits `ack_timeout_s` for acks; everything else
    (joining, a receiver waiting for the next bucket) two minutes, for processes slow to start."""
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    transport = SharedBufferTransport(store, rank, world_size, sharing, ack_timeout_s, torch.device("cpu"))
    return WeightChannel(transport, rank, store)


BUCKET_SIZES = [1, 100, 1 << 20]  # a tensor per bucket, a few per bucket, all in one


def transfer(rank: int, port: int):
    sharing = SlowSharing()
    channel = shared_memory_channel(rank, port, 3, sharing)
    assert channel.backend == "ipc"
    if rank == 0:
        return [channel.send(iter(weights()), bucket_bytes) for bucket_bytes in BUCKET_SIZES], sharing.most_held
    return [[(name, tensor.clone()) for name, tensor in channel.receive()] for _ in BUCKET_SIZES]


@pytest.fixture(scope="module")
def slow_transfer():
    """One sender and two receivers that copy every bucket late, over three bucket sizes (one spawn for the
    tests below)."""
    return run_ranks(transfer, 3, free_port())


def test_every_receiver_gets_the_senders_tensors_exactly_through_shared_buffers_for_any_bucket_size(slow_transfer):
    (sender, _), *receivers = slow_transfer

    expected = weights()
    for received in receivers:
        assert len(received) == len(BUCKET_SIZES)  # the streams did not run into each other
        for got in received:
            assert [name for name, _ in got] == [name for name, _ in expected]
            for (_, tensor), (_, want) in zip(got, expected):
                assert tensor.dtype == want.dtype and tensor.shape == want.shape and torch.equal(tensor, want)
    assert [stats.num_buckets for stats in sender] == [5, 3, 1]
    assert sender[0].num_bytes == sum(t.numel() * t.element_size() for _, t in expected)


def test_the_sender_keeps_each_buffer_until_every_receiver_copied_it_and_holds_at_most_two(slow_transfer):
    (_, most_held), *_ = slow_transfer

    # The receivers copy each bucket late: had the sender freed a buffer before its acks, the receivers' opening
    # it would have failed (the transfer above raises then), and they got every tensor.
    assert most_held == 2  # double buffering: bucket k+1 packed while bucket k is being copied, never a third


def die_mid_bucket(rank: int, port: int):
    channel = shared_memory_channel(rank, port, 3, DyingSharing() if rank == 2 else HostMemorySharing(), 5.0)
    if rank == 0:
        return channel.send(iter(weights()), 1)
    return list(channel.receive())


def test_a_receiver_that_dies_mid_bucket_fails_the_sender_with_a_timeout_naming_it():
    with pytest.raises(RuntimeError) as failure:
        run_ranks(die_mid_bucket, 3, free_port())

    errors = str(failure.value)
    assert "TimeoutError: weight channel (CUDA IPC): rollout worker 1 (channel rank 2) did not acknowledge" in errors
    assert "the sender (training rank 0) failed before bucket" in errors  # the live receiver stops at once


def fail_to_open(rank: int, port: int):
    channel = shared_memory_channel(rank, port, 3, BrokenSharing() if rank == 1 else HostMemorySharing())
    if rank == 0:
        return channel.send(iter(weights()), 1 << 20)
    return list(channel.receive())


def test_a_receiver_that_cannot_open_a_bucket_fails_the_sender_with_its_error():
    with pytest.raises(RuntimeError) as failure:
        run_ranks(fail_to_open, 3, free_port())

    errors = str(failure.value)
    assert (
        "bucket 0 failed on rollout worker 0 (channel rank 1): OSError: cannot open the buffer's handle" in errors
    )  # at once: the sender does not wait out its two-minute ack timeout


def test_a_cuda_ipc_handle_that_does_not_open_is_an_error_naming_the_switch_that_turns_ipc_off(monkeypatch):
    import contextlib

    import hyflow.workers.ipc_transfer as ipc_transfer

    def refused(*args):
        raise RuntimeError("CUDA error: invalid resource handle")

    monkeypatch.setattr(ipc_transfer, "rebuild_cuda_tensor", refused)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())  # no GPU on this machine
    handle = (None,) * (ipc_transfer._DEVICE_ARG + 1)
    with pytest.raises(RuntimeError, match=r"invalid resource handle.*HYFLOW_WEIGHT_CHANNEL_IPC=0"):
        ipc_transfer.CudaIpcSharing().copy(handle, torch.device("cuda", 0))
