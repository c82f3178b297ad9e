"""benchmarks/grpo_step.py on the Ray backend with the tiny shape on the CPU: two workers forming one engine of
TP 2 train two GRPO steps, and the report gives tokens/s per GPU and the weight sync's bytes per rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..process_kit import shell_env

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "grpo_step.py"


@pytest.mark.ray
@pytest.mark.slow  # a Ray cluster, two workers, two GRPO steps
@pytest.mark.timeout(600)
def test_the_tiny_shape_on_two_ray_workers_with_one_tp2_engine_reports_per_gpu_throughput(tmp_path):
    command = [sys.executable, str(SCRIPT), "--tiny", "--backend", "ray", "--gpus", "2", "--tp", "2", "--steps", "2"]
    done = subprocess.run(command, env={**shell_env(), "OUT": str(tmp_path)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "generated tok/s per GPU" in done.stdout
    result = json.loads((tmp_path / "grpo_step_ray_2gpu.json").read_text())
    hyflow = result["hyflow"]
    assert result["shape"]["tp"] == 2 and len(hyflow["step_s"]) == 2
    assert hyflow["generated_tokens_per_s_per_gpu"] == pytest.approx(hyflow["generated_tokens_per_s"] / 2)
    sync = hyflow["weight_sync_mean"]  # step 2 synced the weights of step 1's update, half of them to each rank
    assert sync["rollout/weight_sync_gb"] > 0 and sync["rollout/weight_sync_comm_gb"] > 0
