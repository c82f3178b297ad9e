"""RayWorkerGroup on a real local Ray cluster (CPU): dispatch modes, env vars, futures between groups, attach."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hyflow.controller import LocalWorkerGroup, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, parallel_put
from hyflow.protocol import DataProto

from .sample_workers import EagerDistributedWorker, RankWorker

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def two_workers(ray_session):
    wg = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(RankWorker), timeout_s=60)
    yield wg
    wg.kill()


@pytest.fixture(scope="module")
def four_workers(ray_session):
    cls_with_init = RayClassWithInitArgs(RankWorker, offset=100)
    cls_with_init.update_options({"runtime_env": {"env_vars": {"HYFLOW_TEST_FLAG": "on"}}})
    wg = RayWorkerGroup(RayResourcePool([4], use_gpu=False), cls_with_init, "four", detached=True, timeout_s=60)
    yield wg
    wg.kill()


def test_a_plain_ray_actor_accumulates_across_calls(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0.1)
    class Accumulator:
        def __init__(self) -> None:
            self.total = 0

        def add(self, value: int) -> int:
            self.total += value
            return self.total

    accumulator = Accumulator.remote()
    assert ray.get([accumulator.add.remote(v) for v in (1, 2, 3)]) == [1, 3, 6]


def test_one_to_all_returns_one_value_per_worker_offset_by_its_rank(two_workers):
    assert two_workers.world_size == 2
    assert two_workers.add_rank(10) == [10, 11]


def test_dp_compute_proto_splits_ten_rows_over_four_workers_and_returns_them_in_order(four_workers):
    data = DataProto.from_dict({"x": torch.arange(10)}, non_tensors={"uid": np.array(list("abcdefghij"), dtype=object)})
    out = four_workers.double(data)
    assert len(out) == 10
    assert torch.equal(out.batch["doubled"], torch.arange(10) * 2)
    # 10 rows padded to 12: each rank computed 3 rows, in rank order
    assert out.batch["shard_rows"].tolist() == [3] * 10
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]


def test_all_to_all_gives_rank_r_item_r_of_lists_as_long_as_the_group(two_workers):
    assert two_workers.echo(["a", "b"], shared=[1, 2, 3]) == [(0, "a", [1, 2, 3]), (1, "b", [1, 2, 3])]


def test_rank_zero_dispatch_runs_only_on_rank_zero_and_returns_its_result(two_workers):
    label, rank, pid = two_workers.describe("hello")
    assert (label, rank, pid) == ("hello", 0, two_workers.worker_pids[0])
    assert two_workers.rank_zero_only() == 0


def test_dp_compute_proto_with_func_sends_the_function_to_every_rank(two_workers):
    out = two_workers.apply(torch.neg, DataProto.from_dict({"x": torch.arange(4)}))
    assert out.batch["x"].tolist() == [0, -1, -2, -3]


def test_each_worker_sees_its_rank_env_vars_rank_zeros_master_address_and_its_options(four_workers):
    envs = four_workers.dist_env()
    assert [int(e["RANK"]) for e in envs] == [0, 1, 2, 3]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert [int(e["LOCAL_RANK"]) for e in envs] == [0, 1, 2, 3]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"4"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert envs[0]["MASTER_ADDR"] == envs[0]["ip"] and int(envs[0]["MASTER_PORT"]) > 0
    assert len({e["pid"] for e in envs}) == 4
    assert four_workers.getenv("HYFLOW_TEST_FLAG") == ["on"] * 4  # options from update_options reach the actors


def test_a_non_blocking_result_feeds_another_group_without_collecting_it_first(two_workers, four_workers):
    data = DataProto.from_dict({"x": torch.arange(8)})
    future = two_workers.double_later(data)
    assert not isinstance(future, DataProto)
    out = four_workers.double(future)  # each of the 4 workers resolves the 2 refs and keeps its quarter
    assert out.batch["doubled"].tolist() == (torch.arange(8) * 4).tolist()
    assert out.batch["rank"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert future.get().batch["x"].tolist() == (torch.arange(8) * 2).tolist()


def test_a_non_blocking_per_rank_result_is_what_ray_get_accepts(two_workers, ray_session):
    refs = two_workers.add_rank_later(5)
    assert ray_session.get(refs) == [5, 6]
    assert ray_session.get(two_workers.rank_zero_later()) == 0


def test_a_group_attaches_to_running_workers_by_name_prefix(four_workers):
    attached = RayWorkerGroup.from_detached(name_prefix="four", ray_cls_with_init=RayClassWithInitArgs(RankWorker))
    assert attached.world_size == 4
    assert attached.worker_pids == four_workers.worker_pids
    assert attached.add_rank(0) == [100, 101, 102, 103]


@pytest.mark.multiproc
def test_two_workers_initialise_torch_distributed_on_gloo_and_all_reduce(two_workers):
    assert [total for total, _ in two_workers.all_reduce_ranks()] == [3.0, 3.0]


@pytest.mark.gpu
def test_a_gpu_pool_gives_each_worker_one_device_and_nccl_all_reduces(ray_session):
    n = torch.cuda.device_count()
    wg = RayWorkerGroup(RayResourcePool([n], use_gpu=True), RayClassWithInitArgs(RankWorker), timeout_s=120)
    assert wg.all_reduce_ranks(backend="nccl") == [(n * (n + 1) / 2, 1)] * n
    wg.kill()


def test_the_local_backend_gives_the_same_results_as_ray(two_workers):
    local = LocalWorkerGroup(RayClassWithInitArgs(RankWorker))
    data = DataProto.from_dict({"x": torch.arange(5)})
    ray_out, local_out = two_workers.double(data), local.double(data)
    assert torch.equal(ray_out.batch["doubled"], local_out.batch["doubled"])
    assert local.add_rank(10) == two_workers.add_rank(10)[:1]
    assert local.describe("x")[:2] == two_workers.describe("x")[:2]
    assert local.echo(["only"])[0][1] == "only"


def test_several_groups_share_one_pool_by_default_each_in_its_own_processes(ray_session):
    pool = RayResourcePool([2], use_gpu=False)
    groups = [RayWorkerGroup(pool, RayClassWithInitArgs(RankWorker), timeout_s=60) for _ in range(3)]
    try:
        assert [wg.add_rank(0) for wg in groups] == [[0, 1]] * 3
        assert len({pid for wg in groups for pid in wg.worker_pids}) == 6
    finally:
        for wg in groups:
            wg.kill()
        pool.remove()


def test_workers_may_join_torch_distributed_inside_their_init(ray_session):
    wg = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(EagerDistributedWorker), timeout_s=60)
    try:
        assert wg.sum_of_ranks() == [1.0, 1.0]
    finally:
        wg.kill()


def test_worker_env_reaches_every_worker_beside_verl_s_local_world_size(ray_session):
    wg = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(RankWorker), worker_env={"MY_FLAG": "7"}
    )
    try:
        assert wg.getenv("MY_FLAG") == ["7", "7"]
        assert wg.getenv("RAY_LOCAL_WORLD_SIZE") == ["2", "2"]
        assert wg.getenv("WG_BACKEND") == ["ray", "ray"]
    finally:
        wg.kill()


def test_worker_env_may_not_replace_the_group_s_own_variables(ray_session):
    with pytest.raises(ValueError, match=r"worker_env=...\) sets \['WORLD_SIZE'\], which the group sets itself"):
        RayWorkerGroup(
            RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(RankWorker), worker_env={"WORLD_SIZE": "9"}
        )


def test_a_cuda_device_name_on_a_pool_without_gpus_is_refused_with_the_fix(ray_session):
    with pytest.raises(ValueError, match="device_name='cuda'\\) on a pool without GPUs"):
        RayWorkerGroup(RayResourcePool([1], use_gpu=False), RayClassWithInitArgs(RankWorker), device_name="cuda")


def test_parallel_put_returns_refs_in_order_and_refuses_an_empty_list(ray_session):
    refs = parallel_put([{"a": 1}, torch.arange(3), "three"], max_workers=2)
    values = ray_session.get(refs)
    assert values[0] == {"a": 1} and values[1].tolist() == [0, 1, 2] and values[2] == "three"
    with pytest.raises(ValueError, match="parallel_put got an empty list"):
        parallel_put([])
