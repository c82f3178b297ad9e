"""GRPO end to end on the Ray backend: two CPU worker processes (FSDP2 over gloo), colocated roles."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from hyflow.controller import WorkerTimeoutError
from hyflow.trainer.ppo_trainer import PPOTrainer
from tests.process_kit import shell_env, wait_until_gone
from tests.trainer.ppo_testkit import build_assets, read_metrics, tiny_config, tiny_overrides

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


def test_a_clean_ray_run_of_hyflow_train_ends_with_exit_0_and_no_signal_stack_dump(tmp_path):
    assets = build_assets(tmp_path / "assets")
    one_worker = ["trainer.backend=ray", "trainer.n_gpus_per_node=1", "trainer.ray_init.num_cpus=1"]
    args = [*tiny_overrides(assets, tmp_path), *one_worker, "trainer.total_training_steps=1"]

    result = subprocess.run(
        [sys.executable, "-m", "hyflow.trainer.main_ppo", *args],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=shell_env(), check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "logs" / "tests" / "tiny" / "metrics.jsonl").is_file()
    # the reward function's forked child, SIGTERMed at exit, printed Ray's fatal-signal dump (`SIGTERM received`)
    assert "SIGTERM received" not in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr


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
