"""Helpers for tests that stop or kill processes: is a process still running, wait until some are gone."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def process_running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone: it only waits to be reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def wait_until_gone(pids: list[int], patience_s: float = 60.0) -> bool:
    """Whether every process in `pids` exits within `patience_s`; the ones left are SIGKILLed (so a failing test
    leaves no stopped process behind)."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        if not any(process_running(pid) for pid in pids):
            return True
        time.sleep(0.2)
    for pid in pids:
        if process_running(pid):
            os.kill(pid, signal.SIGKILL)
    return False


def shell_env() -> dict[str, str]:
    """The environment a command typed into a fresh shell sees: this process's, without the distributed env
    (RANK, MASTER_PORT, ...) that an in-process worker group of this test session wrote, whose port it still holds."""
    from hyflow.controller.worker import DIST_ENV_KEYS

    return {key: value for key, value in os.environ.items() if key not in DIST_ENV_KEYS}
