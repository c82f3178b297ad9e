"""Weight transfer between pools: what training rank 0 sends, every rollout rank receives bit for bit, in order,
whatever the bucket size and dtype mix."""

import pytest
import torch

from hyflow.controller.worker import free_port
from hyflow.workers.pool_transfer import WeightChannel, channel_backend, pack_bucket, unpack_bucket

from .distributed import run_ranks

pytestmark = pytest.mark.multiproc


def weights() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [
        ("embed.weight", torch.randn(7, 3)),
        ("norm.weight", torch.randn(5).to(torch.bfloat16)),  # 10 bytes: the next tensor's offset needs aligning
        ("layer.weight", torch.randn(4, 6)),
        ("positions", torch.arange(9, dtype=torch.int64)),
        ("scalar", torch.tensor(2.5)),
    ]


def transfer(rank: int, port: int, bucket_sizes: list[int]):
    channel = WeightChannel.join("127.0.0.1", port, rank, world_size=3)
    assert channel.backend == "gloo" and channel.device.type == "cpu"  # CPU processes: buckets in host memory
    results = []
    for bucket_bytes in bucket_sizes:
        if rank == 0:
            results.append(channel.send(iter(weights()), bucket_bytes))
        else:
            results.append([(name, tensor.clone()) for name, tensor in channel.receive()])
    return results


def test_every_rollout_rank_receives_the_senders_tensors_exactly_for_any_bucket_size():
    bucket_sizes = [1, 100, 1 << 20]  # a tensor per bucket, a few per bucket, all in one
    sender, *receivers = run_ranks(transfer, 3, free_port(), bucket_sizes)

    expected = weights()
    for received in receivers:
        for got in received:
            assert [name for name, _ in got] == [name for name, _ in expected]
            for (_, tensor), (_, want) in zip(got, expected):
                assert tensor.dtype == want.dtype and tensor.shape == want.shape
                assert torch.equal(tensor, want)
    assert [stats.num_buckets for stats in sender] == [5, 3, 1]
    assert all(stats.num_tensors == 5 for stats in sender)
    assert sender[0].num_bytes == sum(t.numel() * t.element_size() for _, t in expected)


@pytest.mark.parametrize(
    ("identities", "backend"),
    [
        (["cpu", "cpu", "cpu"], "gloo"),
        (["cuda:GPU-a", "cpu"], "gloo"),  # one member without a GPU
        (["cuda:GPU-a", "cuda:GPU-a", "cuda:GPU-b"], "gloo"),  # one receiver on the sender's GPU, one elsewhere
        (["cuda:GPU-a", "cuda:GPU-b", "cuda:GPU-b"], "gloo"),  # two receivers sharing a GPU that is not the sender's
        (["cuda:GPU-a"], "nccl"),  # nobody to send to: no GPU shared
    ],
)
def test_the_channel_falls_back_to_gloo_unless_the_gpus_are_all_shared_or_all_distinct(
    identities, backend, monkeypatch
):
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert channel_backend(identities) == backend


@pytest.mark.parametrize("identities", [["cuda:GPU-a", "cuda:GPU-a"], ["cuda:GPU-a"] * 4])
def test_members_all_on_the_senders_gpu_use_cuda_ipc_unless_it_is_turned_off(identities):
    assert channel_backend(identities) == "ipc"  # where NCCL refuses two ranks on one device
    assert channel_backend(identities, allow_ipc=False) == "gloo"


def test_members_on_distinct_gpus_use_nccl_where_torch_has_it(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert channel_backend(["cuda:GPU-a", "cuda:GPU-b", "cuda:GPU-c"]) == "nccl"
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    assert channel_backend(["cuda:GPU-a", "cuda:GPU-b", "cuda:GPU-c"]) == "gloo"


def test_a_packed_bucket_unpacks_to_the_same_tensors_each_at_an_aligned_offset_of_the_buffer():
    bucket = [
        *weights(),
        ("transposed", torch.randn(3, 4).t()),  # not contiguous: packed in its logical order
        ("empty", torch.empty(0, 5)),
        ("mask", torch.tensor([True, False, True])),
    ]
    header, flat = pack_bucket(bucket, torch.device("cpu"))

    assert flat.dtype == torch.uint8 and flat.dim() == 1
    assert header == [(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in bucket]
    unpacked = list(unpack_bucket(header, flat))
    assert [name for name, _ in unpacked] == [name for name, _ in bucket]
    for (_, got), (_, want) in zip(unpacked, bucket):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        assert (got.data_ptr() - flat.data_ptr()) % 16 == 0  # a view into the buffer, viewable as its dtype
