"""Weight transfer between pools: what training rank 0 sends, every rollout rank receives bit for bit, in order,
whatever the bucket size and dtype mix."""

import pytest
import torch

from hyflow.controller.worker import free_port
from hyflow.workers.pool_transfer import WeightChannel, channel_backend

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
        (["cuda:GPU-a", "cuda:GPU-a"], "gloo"),  # pools sharing one GPU: NCCL refuses two ranks on a device
    ],
)
def test_the_channel_falls_back_to_gloo_unless_every_member_has_a_gpu_of_its_own(identities, backend):
    assert channel_backend(identities) == backend


def test_members_on_distinct_gpus_use_nccl_where_torch_has_it(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert channel_backend(["cuda:GPU-a", "cuda:GPU-b", "cuda:GPU-c"]) == "nccl"
