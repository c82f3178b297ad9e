"""nd-compute dispatch: one chunk per data-parallel rank of a mesh, shared by its tensor-parallel ranks."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from hyflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from hyflow.controller.nd_dispatch import collect_nd_compute_dataproto, dispatch_nd_compute_dataproto
from hyflow.protocol import DataProto, DataProtoFuture

from .sample_workers import MeshWorker


class MeshGroup:
    """A group's side of nd dispatch without workers: the dp rank and collect flag each worker would answer."""

    def __init__(self, dp_ranks: list[int], collect: list[bool]) -> None:
        self.world_size = len(dp_ranks)
        self._dispatch_info: dict = {}
        self._collect_info: dict = {}
        self._answers = (dp_ranks, collect)
        self.queries = 0

    def _query_dispatch_info(self, mesh_name: str) -> list[int]:
        self.queries += 1
        return self._answers[0]

    def _query_collect_info(self, mesh_name: str) -> list[bool]:
        return self._answers[1]


def rows(n: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n)})


def test_workers_of_one_dp_rank_get_the_same_chunk_and_others_go_to_everyone():
    group = MeshGroup(dp_ranks=[0, 0, 1, 1], collect=[True, False, True, False])
    args, kwargs = dispatch_nd_compute_dataproto("train", group, rows(6), scale=2)
    assert [chunk.batch["x"].tolist() for chunk in args[0]] == [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]]
    assert kwargs == {"scale": [2, 2, 2, 2]}


def test_the_mesh_layout_is_asked_once_and_cached_on_the_group():
    group = MeshGroup(dp_ranks=[0, 1], collect=[True, True])
    dispatch_nd_compute_dataproto("train", group, rows(2))
    dispatch_nd_compute_dataproto("train", group, rows(4))
    assert group.queries == 1
    assert group._dispatch_info == {"train": [0, 1]} and group._collect_info == {"train": [True, True]}


def test_collect_keeps_one_result_per_dp_rank_in_dp_rank_order():
    group = MeshGroup(dp_ranks=[1, 1, 0, 0], collect=[False, True, True, False])  # dp rank 1 sits on ranks 0-1
    dispatch_nd_compute_dataproto("train", group, rows(4))
    outputs = [rows(1), DataProto.from_dict({"x": torch.tensor([20, 30])}), rows(2), rows(1)]
    assert collect_nd_compute_dataproto("train", group, outputs).batch["x"].tolist() == [0, 1, 20, 30]


def test_collect_refuses_a_layout_that_would_lose_a_dp_rank_rows():
    group = MeshGroup(dp_ranks=[0, 0, 1, 1], collect=[True, False, False, False])
    dispatch_nd_compute_dataproto("train", group, rows(4))
    with pytest.raises(ValueError, match=r"no worker of dp rank\(s\) \[1\] is marked is_collect"):
        collect_nd_compute_dataproto("train", group, [rows(2)] * 4)


def test_dispatch_refuses_dp_ranks_with_a_gap():
    with pytest.raises(ValueError, match="every dp rank from 0 to 2 needs at least one worker"):
        dispatch_nd_compute_dataproto("train", MeshGroup([0, 2], [True, True]), rows(4))


def test_a_tensordict_whose_rows_do_not_divide_by_the_dp_size_is_refused_with_the_fix():
    td = TensorDict({"x": torch.arange(3)}, batch_size=[3])
    with pytest.raises(ValueError, match="3 rows, which do not divide into 2 data-parallel chunks"):
        dispatch_nd_compute_dataproto("train", MeshGroup([0, 1], [True, True]), td)


def test_a_future_is_chunked_per_dp_rank_and_resolved_by_each_worker():
    future = DataProtoFuture(collect_fn=DataProto.concat, futures=[rows(2), rows(4)[2:]])
    args, _ = dispatch_nd_compute_dataproto("train", MeshGroup([0, 0, 1, 1], [True] * 4), future)
    assert [part.get().batch["x"].tolist() for part in args[0]] == [[0, 1], [0, 1], [2, 3], [2, 3]]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_ray_group_on_a_two_by_two_mesh_returns_each_row_once_from_the_collecting_ranks(ray_session):
    wg = RayWorkerGroup(RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(MeshWorker), timeout_s=150)
    try:
        out = wg.tag_rows(rows(6))
        assert out.batch["x"].tolist() == list(range(6))
        assert out.batch["rank"].tolist() == [0, 0, 0, 2, 2, 2]  # tp rank 0 of dp 0 is rank 0, of dp 1 rank 2
        td = wg.tag_tensordict_later(TensorDict({"x": torch.arange(4)}, batch_size=[4])).get()
        assert isinstance(td, TensorDict) and td["rank"].tolist() == [0, 0, 2, 2]
    finally:
        wg.kill()
