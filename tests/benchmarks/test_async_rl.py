"""benchmarks/async_rl.py: on one GPU (`--device cuda`) the split modes put the rollout worker beside the training
worker on the same device; on the CPU it runs end to end and reports every mode's tokens/s."""

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
