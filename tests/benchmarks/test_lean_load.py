"""benchmarks/lean_load.py runs under torchrun on 2 CPU ranks (gloo) with the tiny shape, for the reward model and
the actor: the lean load slices the checkpoint, the ranks together read every byte of it once, and the JSON (each
rank's host peak and seconds beside the full load's) lands in $OUT."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..process_kit import shell_env

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "lean_load.py"


@pytest.mark.multiproc
@pytest.mark.slow  # two torchrun ranks, twice
@pytest.mark.timeout(420)
@pytest.mark.parametrize("role", ["reward_model", "actor"])
def test_the_tiny_shape_on_two_ranks_reports_the_lean_load_beside_the_full_one(tmp_path, role):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT), "--tiny"]
    command += ["--role", role, "--folder", str(tmp_path / "checkpoint")]
    done = subprocess.run(command, env={**shell_env(), "OUT": str(tmp_path)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " lean: " in done.stdout and " full: " in done.stdout
    result = json.loads((tmp_path / f"lean_load_{role}_tiny_2rank.json").read_text())
    lean = [rank["lean"] for rank in result["per_rank"]]
    assert [rank["mode"] for rank in lean] == ["sliced", "sliced"]
    bf16_bytes = sum(path.stat().st_size for path in (tmp_path / "checkpoint").glob("*.safetensors"))
    assert 0.9 * bf16_bytes / 1e9 < sum(rank["read_gb"] for rank in lean) <= bf16_bytes / 1e9  # all, once
    for name in ("lean", "full"):
        assert set(result[name]) == {"max_rank_peak_host_gb", "node_peak_host_gb", "seconds"}
