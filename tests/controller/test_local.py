"""LocalWorkerGroup: the worker-group API in this process, and a controller package that does not import Ray."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from hyflow.controller import ClassWithInitArgs, LocalWorkerGroup, Worker, register
from hyflow.controller.decorator import Dispatch
from hyflow.protocol import DataProto

from .sample_workers import RankWorker


def test_importing_the_controller_does_not_import_ray():
    code = (
        "import sys, hyflow.controller as c; "
        "assert c.LocalWorkerGroup and c.RayClassWithInitArgs; "
        "assert 'ray' not in sys.modules, 'ray was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_worker_is_a_plain_object_in_this_process_with_rank_zero_of_one():
    wg = LocalWorkerGroup(ClassWithInitArgs(RankWorker, offset=7))
    assert wg.world_size == 1
    assert isinstance(wg.worker, RankWorker) and wg.worker.offset == 7
    assert (wg.worker.rank, wg.worker.world_size, wg.worker.local_rank) == (0, 1, 0)
    label, rank, pid = wg.describe("here")
    assert (label, rank, pid) == ("here", 0, os.getpid())


def test_a_worker_method_is_called_directly_so_a_breakpoint_would_stop_in_this_process():
    seen = []

    class Spy(Worker):
        @register(Dispatch.DP_COMPUTE_PROTO)
        def spy(self, data: DataProto) -> DataProto:
            seen.append(os.getpid())
            return data

    out = LocalWorkerGroup(Spy).spy(DataProto.from_dict({"x": torch.arange(3)}))
    assert seen == [os.getpid()] and out.batch["x"].tolist() == [0, 1, 2]


def test_a_non_blocking_call_returns_a_future_that_another_group_accepts():
    producer, consumer = LocalWorkerGroup(RankWorker), LocalWorkerGroup(RankWorker)
    future = producer.double_later(DataProto.from_dict({"x": torch.arange(3)}))
    assert consumer.double(future).batch["doubled"].tolist() == [0, 4, 8]


def test_execute_all_async_slices_lists_as_long_as_the_group():
    wg = LocalWorkerGroup(RankWorker)
    assert wg.execute_all_sync("echo", ["only"], shared=[1, 2]) == [(0, "only", [1, 2])]


def test_a_worker_method_named_like_a_group_attribute_is_rejected():
    class Clash(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def spawn(self) -> None:
            return None

    with pytest.raises(ValueError, match="rename the worker method"):
        LocalWorkerGroup(Clash)


def test_the_worker_can_start_a_one_process_gloo_group():
    class Dist(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def world(self) -> int:
            self.init_distributed(backend="gloo", timeout_s=30)
            return torch.distributed.get_world_size()

    if torch.distributed.is_initialized():
        pytest.skip("another test left a process group in this session")
    try:
        assert LocalWorkerGroup(Dist).world() == [1]
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_a_class_that_is_not_a_worker_is_rejected_with_the_fix():
    class Plain:
        pass

    with pytest.raises(ValueError, match=r"does not subclass hyflow\.controller\.Worker"):
        LocalWorkerGroup(Plain)


def test_a_non_blocking_per_rank_call_on_the_local_backend_returns_the_results_themselves():
    wg = LocalWorkerGroup(RankWorker)
    assert wg.add_rank_later(5) == [5]
    assert wg.rank_zero_later() == 0


def test_a_controller_function_runs_in_the_worker_on_rank_zero_and_on_every_shard():
    wg = LocalWorkerGroup(RankWorker)
    assert wg.execute_func_rank_zero(lambda a, b: (a + b, os.getpid()), 2, b=3) == (5, os.getpid())
    data = DataProto.from_dict({"x": torch.arange(3)})
    out = wg.execute_with_func_generator(
        lambda worker, shard: DataProto.from_dict({"y": shard.batch["x"] + worker.rank}), data
    )
    assert out.batch["y"].tolist() == [0, 1, 2]
