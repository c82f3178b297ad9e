"""Bucketed weight sync: on 2 gloo ranks the gathered full tensors equal the per-parameter gather, whatever the
bucket size (one bucket, many, a tensor per bucket) and for row counts that do not divide by the ranks."""

import pytest
import torch
from torch import nn

from hyflow.workers.fsdp import build_device_mesh, iter_full_state
from hyflow.workers.weight_sync import SyncStats, iter_bucketed_state

from .distributed import run_ranks

pytestmark = pytest.mark.multiproc


class Odd(nn.Module):
    """Row counts 3, 5 and 1 (uneven over 2 ranks: the last rank holds fewer rows, or none), two dtypes, a buffer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(3, 5, bias=False)
        self.c = nn.Parameter(torch.randn(1, 7))
        self.low = nn.Parameter(torch.randn(6, 2).to(torch.bfloat16))
        self.register_buffer("scale", torch.arange(4.0))


def gather_both_ways(rank: int, bucket_sizes: list[int]):
    from torch.distributed.fsdp import fully_shard

    model = Odd()
    fully_shard(model, mesh=build_device_mesh())
    reference = {name: tensor.clone() for name, tensor in iter_full_state(model)}
    results = []
    for bucket_bytes in bucket_sizes:
        stats = SyncStats()
        gathered = {name: tensor.clone() for name, tensor in iter_bucketed_state(model, bucket_bytes, stats)}
        results.append((gathered, stats))
    return reference, results


def test_bucketed_gather_equals_the_per_parameter_gather_for_any_bucket_size():
    rank_results = run_ranks(gather_both_ways, 2, [1 << 30, 40, 1])
    for reference, results in rank_results:
        assert set(reference) == {"a.weight", "a.bias", "b.weight", "c", "low", "scale"}
        for gathered, stats in results:
            assert list(gathered) == list(reference)
            for name, tensor in reference.items():
                assert gathered[name].dtype == tensor.dtype and torch.equal(gathered[name], tensor), name
            assert stats.num_tensors == len(reference)
            assert stats.num_bytes == sum(t.numel() * t.element_size() for t in reference.values())
    one_bucket, small, per_tensor = (stats.num_buckets for _, stats in rank_results[0][1])
    assert one_bucket == 3  # in module order: c (fp32), low (bf16), a and b (fp32) — a bucket holds one dtype
    assert one_bucket < small <= per_tensor == 5
