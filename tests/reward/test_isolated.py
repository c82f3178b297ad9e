"""The forked scoring child of the naive/batch/dapo managers dies with the trainer that started it, also when the
trainer is killed (SIGKILL), whether it scored on the main thread or in a thread pool's thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]

# A trainer stand-in: builds a naive manager, scores one batch (on the main thread or in a thread that then ends),
# prints the scoring child's pid after each of two calls, and waits to be killed.
TRAINER = textwrap.dedent(
    """
    import sys, threading, time
    from hyflow.models.tiny import build_tiny_tokenizer
    from hyflow.reward.managers.naive import NaiveRewardManager
    from tests.reward.conftest import build_batch

    tokenizer = build_tiny_tokenizer()
    manager = NaiveRewardManager(tokenizer, compute_score=lambda **kwargs: 1.0)
    batch = build_batch(tokenizer, ["a"], ["1"], ["arith"])
    if sys.argv[1] == "thread":
        scorer = threading.Thread(target=manager, args=(batch,))
        scorer.start()
        scorer.join()
    else:
        manager(batch)
    print(manager.isolated._process.pid, flush=True)
    time.sleep(0.5)  # the scoring thread has ended; its child must still serve the next call
    manager(batch)
    print(manager.isolated._process.pid, flush=True)
    time.sleep(600)
    """
)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie has ended; only its exit status waits to be collected)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _wait_until_gone(pid: int, limit_s: float = 30.0) -> bool:
    deadline = time.monotonic() + limit_s
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _running(pid)


@pytest.mark.parametrize("scored_on", ["main", "thread"])
def test_the_scoring_child_dies_when_its_trainer_is_killed(scored_on):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, scored_on], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    child = None
    try:
        first, second = int(trainer.stdout.readline()), int(trainer.stdout.readline())
        child = second
        assert first == second, "the child forked in the scoring thread must outlive that thread"
        assert _running(child)
        trainer.kill()
        trainer.wait()
        assert _wait_until_gone(child), f"the scoring child {child} outlived its killed trainer"
    finally:
        trainer.kill()
        trainer.wait()
        if child is not None and _running(child):
            os.kill(child, signal.SIGKILL)
