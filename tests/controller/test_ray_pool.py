"""RayResourcePool: ranks laid out node by node on a simulated two-node cluster, and clear placement errors.

The two-node cluster runs in a child process, so that it neither needs nor disturbs the Ray session that other
tests share.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hyflow.controller import RayResourcePool

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def report_layout_on_two_nodes() -> None:
    """Child process: start a 2-node cluster, place 2 + 2 workers, print each rank's env as one JSON line."""
    import ray
    from ray.cluster_utils import Cluster

    from hyflow.config.trainer import RayInitConfig
    from hyflow.controller import RayClassWithInitArgs, RayWorkerGroup, init_ray

    from . import sample_workers

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        init_ray(RayInitConfig(address=cluster.address))  # joins the cluster instead of starting one
        ray.cloudpickle.register_pickle_by_value(sample_workers)
        pool = RayResourcePool([2, 2], use_gpu=False, num_cpus_per_worker=1.0)  # a node's 2 CPUs per group
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(sample_workers.RankWorker), timeout_s=120)
        print("LAYOUT " + json.dumps({"envs": wg.dist_env(), "add_rank": wg.add_rank(0)}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_ranks_are_laid_out_node_by_node_with_local_ranks_and_one_master():
    code = f"import sys; sys.path.insert(0, {TESTS_DIR!r}); from controller import test_ray_pool as t; " + (
        "t.report_layout_on_two_nodes()"
    )
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": ""}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=220, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("LAYOUT ")]
    assert done.returncode == 0 and lines, f"child failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads(lines[0].removeprefix("LAYOUT "))
    envs = report["envs"]
    nodes = [e["node_id"] for e in envs]
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2]
    assert [int(e["RANK"]) for e in envs] == [0, 1, 2, 3]
    assert [int(e["LOCAL_RANK"]) for e in envs] == [0, 1, 0, 1]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"} and {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert envs[0]["MASTER_ADDR"] == envs[0]["ip"]
    assert report["add_rank"] == [0, 1, 2, 3]


def test_a_pool_the_cluster_cannot_hold_fails_with_a_message_naming_the_request(ray_session):
    pool = RayResourcePool([64], use_gpu=True, ready_timeout_s=1.0)
    with pytest.raises(ValueError, match=r"node 0 needs 64 bundles of \{'CPU': 1.0, 'GPU': 1.0\}"):
        pool.bundles()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_split_pool_runs_two_groups_on_disjoint_bundles_and_a_merged_pool_spans_both(ray_session):
    from hyflow.controller import RayClassWithInitArgs, RayWorkerGroup, merge_resource_pool, split_resource_pool

    from .sample_workers import RankWorker

    pool = RayResourcePool([4], use_gpu=False)
    small, large = split_resource_pool(pool, [1, 3])
    assert (small.world_size, large.world_size) == (1, 3)
    assert [b.index for b in small.bundles()] == [0] and [b.index for b in large.bundles()] == [1, 2, 3]
    halves = split_resource_pool(large, [2, 1])  # a split pool splits again
    merged = merge_resource_pool(small, halves[1])
    assert [b.index for b in merged.bundles()] == [0, 3]
    groups = [RayWorkerGroup(p, RayClassWithInitArgs(RankWorker), timeout_s=150) for p in (small, large, merged)]
    try:
        assert [g.add_rank(0) for g in groups] == [[0], [0, 1, 2], [0, 1]]  # ranks restart at 0 in every group
        assert len(pool.get_placement_groups()) == 1
        with pytest.raises(ValueError, match="call remove\\(\\) on the pool\\(s\\) it came from"):
            small.remove()
    finally:
        for group in groups:
            group.kill()
        pool.remove()


def test_split_sizes_that_do_not_cover_the_pool_are_refused():
    from hyflow.controller import split_resource_pool

    pool = RayResourcePool([4], use_gpu=False)
    with pytest.raises(ValueError, match="an int split size must divide the pool's world size 4"):
        split_resource_pool(pool, 3)
    with pytest.raises(ValueError, match="positive ints summing to the pool's world size 4"):
        split_resource_pool(pool, [1, 2])
