"""Bucketed weight sync: on 2 gloo ranks the gathered full tensors equal the per-parameter gather, whatever the
bucket size (one bucket, many, a tensor per bucket) and for row counts that do not divide by the ranks, cast to the
engine's dtype, or cut to uneven TP slices (rows and columns) by the all-to-all; on 4 ranks
engines of TP size 1, 2 and 4 receive exactly their slices of every weight (about 1/tp of the bytes) and load them
into the same model as the full tensors give."""

import functools

import pytest
import torch
from torch import nn

from hyflow.engine.parallel import TensorSlice
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
    in_bf16 = {name: tensor.clone() for name, tensor in iter_bucketed_state(model, 40, dtype=torch.bfloat16)}
    sliced = {name: tensor.clone() for name, tensor in iter_bucketed_state(model, 1 << 30, tp_slices=ODD_SLICES.get)}
    return reference, results, in_bf16, sliced


# Uneven TP slices of two ranks (one engine over both): rows of `a.weight` and `low`, columns of `b.weight`.
ODD_SLICES = {
    "a.weight": [TensorSlice(0, 0, 2, 3), TensorSlice(0, 2, 1, 3)],
    "b.weight": [TensorSlice(1, 0, 1, 3), TensorSlice(1, 1, 2, 3)],
    "low": [TensorSlice(0, 1, 4, 6), TensorSlice(0, 5, 1, 6)],
}


def test_bucketed_gather_equals_the_per_parameter_gather_for_any_bucket_size():
    rank_results = run_ranks(gather_both_ways, 2, [1 << 30, 40, 1])
    for rank, (reference, results, in_bf16, sliced) in enumerate(rank_results):
        for name, tensor in reference.items():  # an engine of TP 2: each rank gets its slice, the rest whole
            expected = ODD_SLICES[name][rank].take(tensor) if name in ODD_SLICES else tensor
            assert torch.equal(sliced[name], expected), name
        for name, tensor in reference.items():  # the engine's dtype: the sharded parameters travel cast to it
            expected = tensor if name == "scale" else tensor.to(torch.bfloat16)  # the buffer is no DTensor
            assert in_bf16[name].dtype == expected.dtype and torch.equal(in_bf16[name], expected), name
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


def sync_into_tp_engines(rank: int, tp_sizes: list[int], bucket_sizes: list[int]) -> dict:
    """For each TP size: the sliced sync's tensors against the slices of the full tensors, its stats, and whether an
    engine of that TP size loaded from the slices holds what one loaded from the full tensors does."""
    from torch.distributed.fsdp import fully_shard

    from hyflow.engine.models import build_model, tp_weight_slices
    from hyflow.engine.models.llama import DecoderArgs
    from hyflow.engine.parallel import TensorParallel

    from ..engine.engine_testkit import make_tiny_hf_model

    # One KV head (replicated on every TP rank), a vocabulary of 95 (the last rank's rows padded), biases on the
    # row-parallel projections, row counts that 4 ranks do not all divide.
    model = make_tiny_hf_model("llama", vocab_size=95, num_key_value_heads=1, attention_bias=True, mlp_bias=True)
    config = model.config
    fully_shard(model, mesh=build_device_mesh())
    full = {name: tensor.clone() for name, tensor in iter_full_state(model)}
    out = {}
    for tp_size in tp_sizes:
        args = DecoderArgs.from_hf(config, "llama", 64).sharded(tp_size, rank % tp_size)
        tp = TensorParallel.from_world(tp_size)
        for bucket_bytes in bucket_sizes:
            stats = SyncStats()
            synced = iter_bucketed_state(model, bucket_bytes, stats, functools.partial(tp_weight_slices, args))
            synced = {name: tensor.clone() for name, tensor in synced}
            mismatched = []
            for name, tensor in full.items():
                slices = tp_weight_slices(args, name)
                expected = tensor if slices is None else slices[rank % tp_size].take(tensor)
                if not torch.equal(synced[name], expected):
                    mismatched.append(name)
            from_slices, from_full = build_model(config, 64, tp=tp), build_model(config, 64, tp=tp)
            for param in [*from_slices.parameters(), *from_full.parameters()]:
                param.zero_()  # the vocabulary's padding rows are never loaded
            assert from_slices.load_weights(synced.items()) == from_full.load_weights(full.items())
            same = all(
                torch.equal(a, b) for a, b in zip(from_slices.state_dict().values(), from_full.state_dict().values())
            )
            out[tp_size, bucket_bytes] = {"names": list(synced), "mismatched": mismatched, "stats": stats, "same": same}
    out["names"] = list(full)
    return out


def _check_tp_sync(results: list[dict], tp_sizes: list[int]) -> None:
    for rank_result in results:
        for tp_size in tp_sizes:
            for bucket_bytes in (1 << 30, 1):
                case = rank_result[tp_size, bucket_bytes]
                assert case["names"] == rank_result["names"]
                assert not case["mismatched"], (tp_size, bucket_bytes, case["mismatched"])
                assert case["same"], "the engine loaded from slices differs from the one loaded from full tensors"
            one_bucket, per_tensor = rank_result[tp_size, 1 << 30]["stats"], rank_result[tp_size, 1]["stats"]
            assert one_bucket.num_buckets < per_tensor.num_buckets
            assert one_bucket.comm_bytes <= per_tensor.comm_bytes
        gathered = rank_result[1, 1 << 30]["stats"].comm_bytes  # every rank receives the whole model
        for tp_size in tp_sizes[1:]:
            received = rank_result[tp_size, 1 << 30]["stats"].comm_bytes
            assert received < gathered * (1 / tp_size + 0.25), (tp_size, received, gathered)


@pytest.mark.slow  # four spawned ranks
def test_tp_engines_on_four_ranks_receive_their_slices_and_about_one_tp_th_of_the_bytes():
    _check_tp_sync(run_ranks(sync_into_tp_engines, 4, [1, 2, 4], [1 << 30, 1]), [1, 2, 4])
