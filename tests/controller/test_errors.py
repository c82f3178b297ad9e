"""Failures on workers reach the controller as clear errors: raised exceptions, dead processes, timeouts."""

from __future__ import annotations

import os
import signal
import time

import pytest

from hyflow.controller import (
    LocalWorkerGroup,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
)
from tests.process_kit import wait_until_gone

from .sample_workers import BrokenWorker, RankWorker


def test_local_worker_exception_names_rank_method_and_keeps_the_original_as_cause():
    wg = LocalWorkerGroup(RankWorker)
    with pytest.raises(WorkerError) as caught:
        wg.fail_on(0)
    assert caught.value.rank == 0 and caught.value.method == "fail_on"
    assert "rank 0 was told to fail" in caught.value.remote_traceback
    assert isinstance(caught.value.__cause__, ValueError)


def test_local_worker_that_fails_in_init_raises_worker_error_for_init():
    class Broken(RankWorker):
        def __init__(self) -> None:
            raise RuntimeError("no model here")

    with pytest.raises(WorkerError, match="__init__") as caught:
        LocalWorkerGroup(Broken)
    assert "no model here" in str(caught.value)


@pytest.mark.ray
@pytest.mark.timeout(180)
class TestOnRay:
    @pytest.fixture(scope="class")
    def group(self, ray_session):
        wg = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(RankWorker))
        yield wg
        wg.kill()

    def test_a_worker_that_raises_surfaces_with_its_rank_method_and_traceback(self, group):
        with pytest.raises(WorkerError) as caught:
            group.fail_on(1)
        error = caught.value
        assert (error.rank, error.method, error.cause_type) == (1, "fail_on", "ValueError")
        assert "rank 1 was told to fail" in str(error)
        assert "sample_workers.py" in error.remote_traceback
        assert group.add_rank(0) == [0, 1]  # the group is still usable

    def test_a_call_past_its_timeout_raises_a_timeout_error(self, group):
        with pytest.raises(WorkerTimeoutError, match=r"did not finish 'sleep' within 0\.5 s") as caught:
            group.sleep(2.0, timeout=0.5)
        assert caught.value.ranks == [0, 1]
        assert group.sleep(0.0) == [0.0, 0.0]  # waits for the slow call to drain, then works

    def test_a_worker_whose_init_raises_fails_group_creation_with_the_init_traceback(self, ray_session):
        with pytest.raises(WorkerError, match="worker rank 0 raised in '__init__'") as caught:
            RayWorkerGroup(RayResourcePool([1], use_gpu=False), RayClassWithInitArgs(BrokenWorker), timeout_s=60)
        assert "actor.clip_ratio=-1: it must be positive" in caught.value.remote_traceback

    def test_a_worker_killed_mid_call_is_reported_dead_with_rank_and_node_without_hanging(self, ray_session):
        wg = RayWorkerGroup(RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(RankWorker))
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match=r"worker rank 1 on node .+ died during 'exit_on'") as caught:
            wg.exit_on(1)
        assert time.monotonic() - start < 60
        assert caught.value.rank == 1
        wg.kill()

    def test_a_stopped_worker_is_named_by_rank_node_and_method_and_kill_ends_it(self, ray_session):
        wg = RayWorkerGroup(
            RayResourcePool([2], use_gpu=False), RayClassWithInitArgs(RankWorker), timeout_s=2, init_timeout_s=120
        )
        stopped = wg.worker_pids[1]
        os.kill(stopped, signal.SIGSTOP)  # alive to the OS and to Ray, but it never answers
        try:
            with pytest.raises(WorkerTimeoutError) as caught:
                wg.add_rank(0)
            assert (caught.value.ranks, caught.value.method) == ([1], "add_rank")
            assert caught.value.nodes == [wg._nodes[1]]
            message = str(caught.value)
            assert f"1 of 2 worker(s) did not finish 'add_rank' within 2 s: rank 1 on node {wg._nodes[1]}." in message
            assert "trainer.worker_call_timeout_s" in str(caught.value)
        finally:
            wg.kill()
        assert wait_until_gone(wg.worker_pids), "ray.kill left a worker process running"
