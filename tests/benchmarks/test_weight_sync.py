"""benchmarks/weight_sync.py runs under torchrun on 2 CPU ranks (gloo) with the tiny shape: engines of TP 2 receive
half the bytes that the full-tensor sync moves, and the JSON lands in $OUT."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..process_kit import shell_env

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "weight_sync.py"


@pytest.mark.multiproc
@pytest.mark.slow  # two torchrun ranks
@pytest.mark.timeout(420)
def test_the_tiny_shape_on_two_ranks_reports_the_sliced_sync_beside_the_full_one(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT)]
    command += ["--tiny", "--tp", "2", "--compare-full", "--repeats", "1"]
    done = subprocess.run(command, env={**shell_env(), "OUT": str(tmp_path)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sliced:" in done.stdout and "full:" in done.stdout
    result = json.loads((tmp_path / "weight_sync_tiny_2rank_tp2.json").read_text())
    sliced, full = result["sliced"], result["full"]
    assert sliced["sync_comm_gb"] < 0.75 * full["sync_comm_gb"]  # each TP rank gets about half of the weights
    assert sliced["sync_gb"] < 0.75 * full["sync_gb"] and len(sliced["seconds"]) == 1
