"""benchmarks/async_rl.py: on one GPU (`--device cuda`) the split modes put the rollout worker beside the training
worker on the same device; on N devices colocated runs on all N and the split modes on K training + N - K rollout
workers; on the CPU it runs end to end (also on 4 workers) and reports every mode's tokens/s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def async_rl(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import async_rl

    yield async_rl
    sys.modules.pop("async_rl", None)


def test_on_one_gpu_the_split_modes_share_the_training_device_and_take_the_gpu_sizes(async_rl):
    args = async_rl.parse_args(["--device", "cuda", "--modes", "colocated,async1"])
    assets = {"train": "t.parquet", "val": "v.parquet", "model": "model"}
    split, colocated = (async_rl.overrides(assets, args, mode) for mode in ("async1", "colocated"))

    assert "trainer.device=cuda" in split and "trainer.rollout_shares_devices=True" in split
    assert "trainer.rollout_shares_devices=True" not in colocated
    assert (args.prompts, args.n, args.response_length, args.shape, args.micro_batch_size) == (64, 8, 256, "0.5b", 64)
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64" in split


def test_with_two_gpus_the_rollout_worker_gets_a_gpu_of_its_own(async_rl):
    args = async_rl.parse_args(["--device", "cuda", "--gpus", "2"])
    split = async_rl.overrides({"train": "", "val": "", "model": ""}, args, "one_step_off")
    assert "trainer.placement=split" in split and "trainer.rollout_shares_devices=True" not in split


def test_on_eight_gpus_colocated_uses_all_eight_and_the_split_modes_four_training_and_four_rollout(async_rl):
    args = async_rl.parse_args(["--device", "cuda", "--gpus", "8"])
    colocated, split = (
        async_rl.overrides({"train": "", "val": "", "model": ""}, args, m) for m in ("colocated", "async1")
    )

    assert "trainer.n_gpus_per_node=8" in colocated and not any("rollout_n_gpus" in o for o in colocated)
    assert {"trainer.n_gpus_per_node=4", "trainer.rollout_n_gpus_per_node=4"} <= set(split)
    assert "trainer.rollout_shares_devices=True" not in split
    assert args.num_cpus >= 8  # a GPU bundle of a Ray pool holds one CPU


def test_each_training_worker_gets_micro_batches_of_at_most_its_share_of_the_step(async_rl):
    args = async_rl.parse_args(["--gpus", "4", "--train-gpus", "1", "--prompts", "8", "--n", "2", "--modes", "sync"])

    assert async_rl.pools(args, "colocated") == (4, 0) and async_rl.pools(args, "sync") == (1, 3)
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4" in async_rl.overrides(
        {"train": "", "val": "", "model": ""}, args, "colocated"
    )  # 16 rows over 4 workers
    assert async_rl.micro_batch(args, "sync") == 16  # one training worker: the whole step


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpus", "4", "--train-gpus", "4"], "must leave the rollout pool a device"),
        (["--gpus", "3", "--prompts", "4", "--n", "2"], "must split evenly over its 3 training worker"),
        (["--gpus", "4", "--train-gpus", "1", "--modes", "async1", "--chunk-prompts", "1"], "rollout workers"),
    ],
    ids=["no_rollout_device", "rows_over_workers", "chunk_over_rollout_workers"],
)
def test_sizes_the_pools_cannot_split_stop_with_the_fix(async_rl, capsys, argv, message):
    with pytest.raises(SystemExit):
        async_rl.parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_tool_delay_runs_agent_loops_scheduled_per_group(async_rl):
    args = async_rl.parse_args(["--tool-delay-s", "2", "--chunk-prompts", "4"])
    split = async_rl.overrides({"train": "", "val": "", "model": ""}, args, "async1")
    assert "actor_rollout_ref.rollout.multi_turn.enable=True" in split and "async_training.chunk_prompts=1" in split
    assert f"actor_rollout_ref.rollout.agent.default_agent_loop={async_rl.SLOW_TOOL_LOOP}" in split


def test_on_the_cpu_a_step_is_one_micro_batch_of_the_small_sizes(async_rl):
    args = async_rl.parse_args([])
    assert (args.device, args.prompts, args.n, args.shape, args.micro_batch_size) == ("cpu", 16, 4, None, 64)
    assert "trainer.rollout_shares_devices=True" not in async_rl.overrides(
        {"train": "", "val": "", "model": ""}, args, "sync"
    )


@pytest.mark.ray
@pytest.mark.slow
def test_the_benchmark_runs_sync_and_fully_async_on_the_cpu_and_writes_its_report(tmp_path):
    command = [sys.executable, str(BENCHMARKS / "async_rl.py"), "--steps", "2", "--modes", "sync,async1"]
    command += ["--prompts", "4", "--n", "2", "--response-length", "8", "--hidden-size", "32", "--num-layers", "2"]
    env = {**os.environ, "OUT": str(tmp_path), "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([*command, "--chunk-prompts", "2"], check=True, env=env, cwd=tmp_path, timeout=500)

    report = json.loads((tmp_path / "async_rl.json").read_text())
    assert set(report["results"]) == {"sync", "async1"}
    assert all(result["tokens_per_s"] > 0 for result in report["results"].values())
    assert report["results"]["async1"]["staleness_mean"] <= 1


@pytest.mark.ray
@pytest.mark.slow
def test_on_four_cpu_workers_colocated_and_two_plus_two_split_report_per_device_rates(tmp_path):
    command = [sys.executable, str(BENCHMARKS / "async_rl.py"), "--gpus", "4", "--steps", "2"]
    command += ["--modes", "colocated,one_step_off", "--prompts", "4", "--n", "2", "--response-length", "8"]
    command += ["--hidden-size", "32", "--num-layers", "2"]
    env = {**os.environ, "OUT": str(tmp_path), "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(command, check=True, env=env, cwd=tmp_path, timeout=500)

    results = json.loads((tmp_path / "async_rl_4gpu.json").read_text())["results"]
    assert (results["colocated"]["train_workers"], results["colocated"]["rollout_workers"]) == (4, 0)
    assert (results["one_step_off"]["train_workers"], results["one_step_off"]["rollout_workers"]) == (2, 2)
    off = results["one_step_off"]
    assert off["tokens_per_s_per_gpu"] == pytest.approx(off["tokens_per_s"] / 4)
    assert off["vs_colocated"] == pytest.approx(off["tokens_per_s"] / results["colocated"]["tokens_per_s"])
    assert off["staleness_mean"] > 0  # it did train off-policy
