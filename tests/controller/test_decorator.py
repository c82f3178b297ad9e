"""Dispatch and collect functions, custom modes, and what @register records (no Ray, no workers)."""

from __future__ import annotations

import pickle

import pytest
import torch

from hyflow.controller import (
    Dispatch,
    Execute,
    LocalWorkerGroup,
    Worker,
    register,
    register_dispatch_mode,
    update_dispatch_mode,
)
from hyflow.controller.decorator import (
    DISPATCH_MODE_FN_REGISTRY,
    PADDING_SIZE_KEY,
    REGISTER_ATTR,
    collect_dp_compute_data_proto,
    dispatch_dp_compute,
    dispatch_dp_compute_data_proto,
    dispatch_one_to_all,
    get_dispatch_mode,
    get_predefined_dispatch_fn,
)
from hyflow.controller.worker_group import GroupShape
from hyflow.protocol import DataProto, DataProtoFuture


def rows(n: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n)})


def test_dp_dispatch_pads_ten_rows_to_twelve_and_reports_the_padding_to_the_group():
    args, kwargs = dispatch_dp_compute_data_proto(GroupShape(4), rows(10), flag=True)
    assert kwargs.pop(PADDING_SIZE_KEY) == 2
    assert [len(chunk) for chunk in args[0]] == [3, 3, 3, 3]
    assert args[0][3].batch["x"].tolist() == [9, 0, 1]  # padding repeats the first rows
    assert kwargs["flag"] == [True] * 4
    joined = collect_dp_compute_data_proto(GroupShape(4), args[0])
    assert joined.batch["x"].tolist() == [*range(10), 0, 1]  # the group drops the 2 padding rows after collect


def test_a_group_call_drops_the_padding_rows_of_a_dp_compute_proto_result():
    class W(Worker):
        @register(Dispatch.DP_COMPUTE_PROTO)
        def same(self, data: DataProto) -> DataProto:
            return data

    assert LocalWorkerGroup(W).same(rows(3)).batch["x"].tolist() == [0, 1, 2]


def test_dp_dispatch_rejects_dataprotos_of_different_lengths():
    with pytest.raises(ValueError, match="same number of rows"):
        dispatch_dp_compute_data_proto(GroupShape(2), rows(4), other=rows(6))


def test_dp_dispatch_chunks_a_future_lazily_so_each_rank_resolves_its_own_part():
    future = DataProtoFuture(collect_fn=DataProto.concat, futures=[rows(2), rows(2)])
    parts = dispatch_dp_compute_data_proto(GroupShape(2), future)[0][0]
    assert [part.get().batch["x"].tolist() for part in parts] == [[0, 1], [0, 1]]


def test_dp_collect_returns_a_list_when_workers_return_something_other_than_dataprotos():
    outputs = [{"loss": 1.0}, {"loss": 2.0}]
    assert collect_dp_compute_data_proto(GroupShape(2), outputs) == outputs


def test_one_to_all_gives_every_rank_every_argument():
    assert dispatch_one_to_all(GroupShape(3), "a", k=1) == ((["a"] * 3,), {"k": [1] * 3})


def test_dp_compute_takes_arguments_already_split_per_rank_and_names_one_that_is_not():
    assert dispatch_dp_compute(GroupShape(2), [1, 2], k=("a", "b")) == (([1, 2],), {"k": ["a", "b"]})
    with pytest.raises(ValueError, match="argument 0 is int"):
        dispatch_dp_compute(GroupShape(2), 5)


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
    def dispatch_reversed(worker_group, values: list) -> tuple[tuple, dict]:  # verl's contract: the group first
        return ([list(reversed(values))] * worker_group.world_size,), {}

    def collect_sum(worker_group, outputs: list) -> int:
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


def test_update_dispatch_mode_replaces_the_pair_of_an_existing_mode():
    def dispatch_doubled(worker_group, value: int) -> tuple[tuple, dict]:
        return ([value * 2] * worker_group.world_size,), {}

    def collect_plus_one(worker_group, outputs: list) -> int:
        return outputs[0] + 1

    register_dispatch_mode("double_then_inc", dispatch_doubled, collect_plus_one)
    update_dispatch_mode("double_then_inc", dispatch_doubled, lambda group, outputs: outputs[0] + 100)

    class W(Worker):
        @register(dispatch_mode="double_then_inc")
        def echo(self, value: int) -> int:
            return value

    assert LocalWorkerGroup(W).echo(5) == 110
    with pytest.raises(ValueError, match="register it first"):
        update_dispatch_mode("no_such_mode", dispatch_doubled, collect_plus_one)


def test_registering_a_dispatch_mode_adds_a_dispatch_member_and_a_registry_row():
    def dispatch(group, *args, **kwargs):
        return args, kwargs

    def collect(group, outputs):
        return outputs

    mode = register_dispatch_mode("test_gather", dispatch, collect)
    try:
        assert mode is Dispatch.TEST_GATHER and "test_gather" in Dispatch
        assert get_predefined_dispatch_fn(Dispatch.TEST_GATHER) == {"dispatch_fn": dispatch, "collect_fn": collect}
        assert DISPATCH_MODE_FN_REGISTRY[mode]["collect_fn"] is collect
    finally:
        Dispatch.remove("test_gather")
        DISPATCH_MODE_FN_REGISTRY.pop(mode)
    assert not hasattr(Dispatch, "TEST_GATHER")


def test_a_dispatch_member_unpickles_as_the_member_of_the_receiving_process():
    assert pickle.loads(pickle.dumps(Dispatch.DP_COMPUTE_PROTO)) is Dispatch.DP_COMPUTE_PROTO
    payload = pickle.dumps(Dispatch.register("only_in_the_controller"))
    Dispatch.remove("only_in_the_controller")  # as in a worker process that never registered it
    try:
        assert pickle.loads(payload) is Dispatch.ONLY_IN_THE_CONTROLLER
    finally:
        Dispatch.remove("only_in_the_controller")


def test_a_dispatch_mode_dict_without_both_functions_is_refused():
    with pytest.raises(ValueError, match="exactly the keys 'dispatch_fn' and 'collect_fn'"):
        get_dispatch_mode({"dispatch_fn": dispatch_one_to_all})
