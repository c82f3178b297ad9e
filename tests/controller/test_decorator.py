"""Dispatch and collect functions, custom modes, and what @register records (no Ray, no workers)."""

from __future__ import annotations

import pytest
import torch

from hyflow.controller import Dispatch, Execute, LocalWorkerGroup, ShardedCall, Worker, register, register_dispatch_mode
from hyflow.controller.decorator import (
    REGISTER_ATTR,
    collect_dp_compute_data_proto,
    dispatch_dp_compute_data_proto,
    dispatch_one_to_all,
    get_dispatch_mode,
)
from hyflow.protocol import DataProto, DataProtoFuture


def rows(n: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n)})


def test_dp_dispatch_pads_ten_rows_to_twelve_and_collect_drops_the_padding():
    sharded = dispatch_dp_compute_data_proto(4, rows(10), flag=True)
    assert sharded.pad_size == 2
    assert [len(chunk) for chunk in sharded.args[0]] == [3, 3, 3, 3]
    assert sharded.args[0][3].batch["x"].tolist() == [9, 0, 1]  # padding repeats the first rows
    assert sharded.kwargs["flag"] == [True] * 4
    joined = collect_dp_compute_data_proto(sharded.args[0], sharded.pad_size)
    assert joined.batch["x"].tolist() == list(range(10))


def test_dp_dispatch_rejects_dataprotos_of_different_lengths():
    with pytest.raises(ValueError, match="same number of rows"):
        dispatch_dp_compute_data_proto(2, rows(4), other=rows(6))


def test_dp_dispatch_chunks_a_future_lazily_so_each_rank_resolves_its_own_part():
    future = DataProtoFuture(collect_fn=DataProto.concat, futures=[rows(2), rows(2)])
    parts = dispatch_dp_compute_data_proto(2, future).args[0]
    assert [part.get().batch["x"].tolist() for part in parts] == [[0, 1], [0, 1]]


def test_dp_collect_returns_a_list_when_workers_return_something_other_than_dataprotos():
    assert collect_dp_compute_data_proto([{"loss": 1.0}, {"loss": 2.0}], 0) == [{"loss": 1.0}, {"loss": 2.0}]


def test_one_to_all_gives_every_rank_every_argument():
    sharded = dispatch_one_to_all(3, "a", k=1)
    assert sharded.args == (["a"] * 3,) and sharded.kwargs == {"k": [1] * 3}


def test_register_records_its_modes_and_rank_zero_dispatch_implies_rank_zero_execution():
    class W(Worker):
        @register(Dispatch.RANK_ZERO)
        def f(self) -> int:
            return 1

    spec = getattr(W.f, REGISTER_ATTR)
    assert spec.dispatch_mode is Dispatch.RANK_ZERO and spec.execute_mode is Execute.RANK_ZERO and spec.blocking


def test_register_rejects_an_unknown_execute_mode_and_lists_the_allowed_ones():
    with pytest.raises(ValueError, match=r"Allowed: \['ALL', 'RANK_ZERO'\]"):
        register(Dispatch.ONE_TO_ALL, execute_mode="everywhere")


def test_an_unknown_dispatch_mode_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown dispatch_mode 'scatter_gather'.*ONE_TO_ALL"):
        get_dispatch_mode("scatter_gather")


def test_a_custom_dispatch_mode_registered_by_name_drives_a_group_call():
    def dispatch_reversed(world_size: int, values: list) -> ShardedCall:
        return ShardedCall(args=([list(reversed(values))] * world_size,))

    def collect_sum(outputs: list, pad_size: int) -> int:
        return sum(outputs)

    register_dispatch_mode("reverse_then_sum", dispatch_reversed, collect_sum)
    with pytest.raises(ValueError, match="already registered"):
        register_dispatch_mode("reverse_then_sum", dispatch_reversed, collect_sum)

    class W(Worker):
        @register(dispatch_mode="reverse_then_sum")
        def first(self, values: list) -> int:
            return values[0]

        @register(dispatch_mode={"dispatch_fn": dispatch_reversed, "collect_fn": collect_sum})
        def last(self, values: list) -> int:
            return values[-1]

    wg = LocalWorkerGroup(W)
    assert wg.first([1, 2, 3]) == 3
    assert wg.last([1, 2, 3]) == 1
