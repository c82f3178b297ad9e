"""SIGTERM of `hyflow train` (python -m hyflow.trainer.main_ppo): every process the run started ends, one line says
where the last complete checkpoint is, and the exit status is non-zero (143). A real process, the local backend."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hyflow.trainer.shutdown import stopped_message
from tests.process_kit import process_running, shell_env, wait_until_gone
from tests.trainer.ppo_testkit import build_assets, tiny_overrides

pytestmark = pytest.mark.timeout(300)


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            after_name = stat.read_text().rsplit(")", 1)[1].split()  # "pid (name) state ppid ..."
        except (OSError, IndexError):
            continue
        if int(after_name[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _wait_for(path: Path, process: subprocess.Popen, patience_s: float = 240.0) -> None:
    deadline = time.monotonic() + patience_s
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the run ended or stalled before writing {path}:\n{process.communicate()[1][-3000:]}")
        time.sleep(0.2)


def test_sigterm_ends_every_process_of_the_run_names_the_last_checkpoint_and_exits_143(tmp_path):
    assets = build_assets(tmp_path / "assets")
    args = [*tiny_overrides(assets, tmp_path), "trainer.save_freq=1", "trainer.total_training_steps=1000"]
    process = subprocess.Popen(
        [sys.executable, "-m", "hyflow.trainer.main_ppo", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=shell_env(),
    )  # fmt: skip
    _wait_for(tmp_path / "ckpt" / "global_step_1" / "trainer_state.pt", process)
    started = children_of(process.pid)  # the reward function's forked child among them: step 1 was scored

    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)

    assert started, "the run had started no process to end (the reward child is forked at the first score)"
    assert process.returncode == 143, stderr[-3000:]
    last_line = stderr.strip().splitlines()[-1]
    step = re.search(r"global_step_(\d+)", last_line)
    assert step is not None, last_line
    assert (tmp_path / "ckpt" / f"global_step_{step.group(1)}" / "trainer_state.pt").is_file()
    assert last_line == "hyflow train: " + stopped_message(signal.SIGTERM, tmp_path / "ckpt")
    assert "Traceback" not in stderr
    assert wait_until_gone(started, patience_s=10), [pid for pid in started if process_running(pid)]


def test_the_stop_line_says_when_no_checkpoint_was_saved(tmp_path):
    line = stopped_message(signal.SIGTERM, tmp_path / "ckpt")

    assert line.startswith(f"stopped by SIGTERM; no checkpoint was saved under {tmp_path / 'ckpt'}")
    assert "trainer.save_freq=N" in line
