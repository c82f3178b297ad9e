"""The weight channel over CUDA IPC: processes on one GPU choose it, and every receiver gets the sender's GPU
tensors bit for bit, in copies of its own that the sender's later writes do not touch.

Skipped without CUDA; the same protocol runs on CPU, over shared host memory, in
test_weight_channel_shared_buffers.py.

    python -m pytest -q tests/workers/test_weight_channel_ipc.py
"""

import pytest
import torch
import torch.distributed as dist

from hyflow.controller.worker import free_port
from hyflow.workers.pool_transfer import WeightChannel, pack_bucket, unpack_bucket

from .distributed import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.multiproc,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def gpu_weights() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(1000, 300, generator=generator).to(torch.bfloat16).cuda()),  # 600 kB
        ("norm.weight", torch.randn(5, generator=generator).to(torch.bfloat16).cuda()),  # 10 bytes: unaligned
        ("layer.weight", torch.randn(64, 48, generator=generator).cuda()),
        ("positions", torch.arange(9, dtype=torch.int64).cuda()),
        ("scalar", torch.tensor(2.5).cuda()),
    ]


BUCKET_SIZES = [1, 100_000, 1 << 30]  # a tensor per bucket, the big one alone, all in one


def transfer(rank: int, port: int):
    """Every process on GPU 0 (run_ranks sets no device): rank 0 sends, ranks 1 and 2 receive."""
    channel = WeightChannel.join("127.0.0.1", port, rank, world_size=3, timeout_s=120.0)
    if rank == 0:
        sent = [channel.send(iter(gpu_weights()), bucket_bytes) for bucket_bytes in BUCKET_SIZES]
        return channel.backend, [stats.num_buckets for stats in sent]
    received = []
    for _ in BUCKET_SIZES:
        received.append([(name, tensor.device.type, tensor.cpu()) for name, tensor in channel.receive()])
    return channel.backend, received


def test_processes_on_one_gpu_choose_cuda_ipc_and_receive_the_weights_bit_for_bit():
    (backend, num_buckets), *receivers = run_ranks(transfer, 3, free_port())

    assert backend == "ipc" and num_buckets == [5, 2, 1]
    expected = [(name, tensor.cpu()) for name, tensor in gpu_weights()]
    for receiver_backend, received in receivers:
        assert receiver_backend == "ipc"
        for got in received:
            assert [name for name, _, _ in got] == [name for name, _ in expected]
            for (_, device, tensor), (_, want) in zip(got, expected):
                assert device == "cuda" and tensor.dtype == want.dtype and tensor.shape == want.shape
                assert torch.equal(
                    tensor.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
                )  # bitwise, bf16 included


def copy_then_overwrite(rank: int, port: int):
    """The sender overwrites its buffer once every receiver acknowledged; the receivers look at theirs after."""
    channel = WeightChannel.join("127.0.0.1", port, rank, world_size=3, timeout_s=120.0)
    if rank == 0:
        header, flat = pack_bucket(gpu_weights(), channel.device)
        channel.transport.send_bucket(header, flat)
        channel.transport.send_end()  # returns after every receiver acknowledged the bucket and the end
        flat.fill_(0)
        torch.cuda.synchronize()
        dist.barrier()
        return None
    header, flat = channel.transport.receive_bucket()
    end = channel.transport.receive_bucket()
    dist.barrier()  # the sender's buffer is zeros now
    return end, [(name, tensor.cpu()) for name, tensor in unpack_bucket(header, flat)]


def test_a_receivers_copy_is_its_own_once_it_acknowledged():
    _, *receivers = run_ranks(copy_then_overwrite, 3, free_port())

    expected = [(name, tensor.cpu()) for name, tensor in gpu_weights()]
    for end, got in receivers:
        assert end is None
        assert [name for name, _ in got] == [name for name, _ in expected]
        for (_, tensor), (_, want) in zip(got, expected):
            assert torch.equal(
                tensor.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
            )  # not the sender's zeros
