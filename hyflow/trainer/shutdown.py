"""How a training run ends: cleanly when it is done, and promptly, with one line, when it is told to stop (SIGTERM:
`kill`, a scheduler's pre-emption or time limit).

    with stop_on_sigterm():                        # SIGTERM raises TrainingStopped in the main thread
        run(config)                                # its `finally` ends the workers, the reward processes and Ray
    # except TrainingStopped as stopped: print(stopped_message("train", stopped.signum, checkpoint_root)); exit 143

The order of the way out (`PPOTrainer.close` and `ppo_trainer.run`): the rollout threads, then the worker groups
(Ray actors killed, placement groups given back), then the processes the reward managers forked or pooled
(`close_reward_processes`, killed with SIGKILL and reaped), then Ray itself when this run started it
(`shutdown_ray`). Ending the reward processes before the interpreter exits matters on Ray: a child forked from a
Ray driver inherits the handler Ray's C++ core installs for SIGTERM, and multiprocessing's exit hook would SIGTERM
it, which prints a `*** SIGTERM received ... __read` stack dump after a run that succeeded.

`ray.init` puts its own SIGTERM handler in place (a bare `sys.exit(15)`); the trainer calls `reclaim_sigterm()` right
after it, so a stop while the workers load still ends through `TrainingStopped`. A second SIGTERM while the first
one's clean-up runs is logged and otherwise ignored, so the clean-up finishes (SIGKILL still ends the process). A
child forked during the run inherits the handler; in the child it ends the process as SIGTERM does by default.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "TrainingStopped",
    "close_reward_processes",
    "exit_code",
    "ray_is_running",
    "reclaim_sigterm",
    "shutdown_ray",
    "stop_on_sigterm",
    "stopped_message",
]

logger = logging.getLogger(__name__)

_state = {"active": False, "stopping": False, "pid": 0}  # pid: the process whose run the handler stops


class TrainingStopped(BaseException):
    """A stop signal arrived. A BaseException, like KeyboardInterrupt: no `except Exception` on the way out
    swallows it, and every `finally` (workers, reward processes, Ray) runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def _on_sigterm(signum: int, frame: Any) -> None:
    if os.getpid() != _state["pid"]:  # a child forked during the run inherited the handler: end it as by default
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _state["stopping"]:
        logger.warning("%s again: still ending the run's processes", signal.Signals(signum).name)
        return
    _state["stopping"] = True
    raise TrainingStopped(signum)


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into `TrainingStopped` in the main thread while the block runs (elsewhere: nothing changes);
    the previous handler is put back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    _state.update(active=True, stopping=False, pid=os.getpid())
    try:
        yield
    finally:
        _state["active"] = False
        signal.signal(signal.SIGTERM, previous)


def reclaim_sigterm() -> None:
    """Put `stop_on_sigterm`'s handler back after a library replaced it (`ray.init` does); nothing outside the block."""
    if _state["active"] and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def exit_code(signum: int) -> int:
    """The shell's exit status of a process ended by `signum` (143 for SIGTERM)."""
    return 128 + signum


def stopped_message(signum: int, checkpoint_root: str | Path | None) -> str:
    """The one line a stopped run prints: the signal, and where the last complete checkpoint is (or that there is
    none)."""
    from hyflow.trainer.checkpoint_manager import complete_checkpoints  # torch: not imported for `hyflow train -h`

    name = signal.Signals(signum).name
    found = complete_checkpoints(checkpoint_root) if checkpoint_root is not None else []
    if not found:
        return (
            f"stopped by {name}; no checkpoint was saved under {checkpoint_root}, so the next run starts from the "
            "beginning (trainer.save_freq=N saves every N steps)."
        )
    return (
        f"stopped by {name}; the last complete checkpoint is {found[0]} (the next run with the same "
        "trainer.default_local_dir resumes from it: trainer.resume_mode=auto)."
    )


def close_reward_processes(manager: Any) -> None:
    """End the processes a reward manager started to score (its forked child, its process pool): the manager's own
    `close()` when it has one, else `close()` of each such part it holds. They start again on the next call."""
    from hyflow.reward.isolated import IsolatedFunction
    from hyflow.reward.scoring_pool import ScoringPool

    if manager is None:
        return
    close = getattr(manager, "close", None)
    if callable(close):
        close()
        return
    for part in vars(manager).values():
        if isinstance(part, (IsolatedFunction, ScoringPool)):
            part.close()


def ray_is_running() -> bool:
    """Whether this process is connected to Ray (without importing Ray when nothing did)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def shutdown_ray() -> None:
    """Disconnect from Ray, and stop the local cluster this process started (its raylet, GCS and workers)."""
    if ray_is_running():
        sys.modules["ray"].shutdown()
