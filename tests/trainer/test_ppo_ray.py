"""GRPO end to end on the Ray backend: two CPU worker processes (FSDP2 over gloo), colocated roles."""

from __future__ import annotations

import os
import signal

import pytest

from hyflow.controller import WorkerTimeoutError
from hyflow.trainer.ppo_trainer import PPOTrainer
from tests.process_kit import wait_until_gone
from tests.trainer.ppo_testkit import build_assets, read_metrics, tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300), pytest.mark.usefixtures("in_tmp_path")]


def test_grpo_on_the_ray_backend_trains_two_data_parallel_workers(ray_started_here, tmp_path):
    assets = build_assets(tmp_path / "assets")
    config = tiny_config(
        assets,
        tmp_path,
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",
        "trainer.ray_init.num_cpus=2",
        "trainer.val_before_train=True",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "trainer.save_freq=2",
    )
    trainer = PPOTrainer(config)
    trainer.init_workers()
    try:
        assert trainer.workers.actor_rollout.world_size == 2
        trainer.fit()
    finally:
        trainer.close()

    steps = read_metrics(trainer.tracking.log_dir)
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert "val-core/arith/acc/mean@1" in steps[0]["data"]
    last = steps[-1]["data"]
    assert {"actor/pg_loss", "actor/kl_loss", "timing_s/ref", "perf/throughput"} <= set(last)
    assert last["global_seqlen/balanced_max"] - last["global_seqlen/balanced_min"] <= last["global_seqlen/minmax_diff"]
    assert (tmp_path / "ckpt" / "global_step_2" / "actor").is_dir()


@pytest.mark.slow
def test_a_stopped_ray_worker_stops_the_run_naming_its_rank_and_method_and_leaves_no_worker_running(
    ray_started_here, tmp_path
):
    assets = build_assets(tmp_path / "assets")
    overrides = ["trainer.backend=ray", "trainer.n_gpus_per_node=2", "trainer.ray_init.num_cpus=2"]
    config = tiny_config(assets, tmp_path, *overrides, "trainer.worker_call_timeout_s=5")
    trainer = PPOTrainer(config)
    trainer.init_workers()
    pids = trainer.workers._fused.worker_pids
    os.kill(pids[1], signal.SIGSTOP)  # rank 1 hangs: alive, but it never answers

    with pytest.raises(WorkerTimeoutError) as caught:
        try:
            trainer.fit()
        finally:
            trainer.close()  # what `run` does on the way out

    assert 1 in caught.value.ranks and caught.value.method == "actor_rollout__generate_sequences"
    assert "within 5 s" in str(caught.value)
    assert wait_until_gone(pids), "a worker process outlived the run"
