"""`IsolatedFunction`: call a reward function in a child process, so that a function which kills its process
(`os._exit`, a segfault, the OOM killer) or hangs is reported instead of ending or freezing the run.

    call = IsolatedFunction(compute_score, timeout_s=None)
    value = call(data_source=..., solution_str=..., ground_truth=..., extra_info=...)
    # raises FunctionRaised / FunctionCrashed / FunctionTimedOut

The child is forked from this process on the first call and serves every later call, so the function is not
pickled (closures work) and state it keeps (caches) lives on between calls in the child; the arguments and results
travel through a pipe and must be picklable. A child that died or timed out is replaced on the next call. Changes
the function makes to objects of this process are not seen here (they happen in the child).

The child dies with this process, also when it is killed (SIGKILL, the OOM killer): it closes the pipe end it
inherited, so the parent's death is an end-of-file on its pipe, and on Linux it asks the kernel for a SIGKILL when
its parent dies (`PR_SET_PDEATHSIG`, which also ends a child stuck in C code). The kernel ties that signal to the
thread that forked, so a child forked from any thread but the main one (a thread pool's, which may end between
calls) watches the parent process itself instead, from a thread of its own.
"""

from __future__ import annotations

import ctypes
import functools
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any


class FunctionRaised(Exception):
    """The function raised `type_name: message` in the child (`details` holds its traceback)."""

    def __init__(self, type_name: str, message: str, details: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message, self.details = type_name, message, details


class FunctionCrashed(Exception):
    """The child process died during the call (its exit code, negative for a signal)."""

    def __init__(self, exit_code: int | None) -> None:
        super().__init__(f"the process running it died (exit code {exit_code})")
        self.exit_code = exit_code


class FunctionTimedOut(Exception):
    """No result within the timeout; the child was killed."""


PR_SET_PDEATHSIG = 1  # linux/prctl.h


@functools.cache
def _prctl() -> Any:
    """libc's `prctl` (Linux), or None. Looked up in the parent before forking: `dlopen` in the child of a
    multi-threaded process could wait forever on a lock another thread held at the fork."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _set_parent_death_signal() -> bool:
    """Ask the kernel to SIGKILL this process when the thread that forked it ends (Linux); False where unavailable."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0


def _exit_when_parent_ends(parent_pid: int) -> None:
    """Block until the process `parent_pid` has ended (a pidfd where the kernel has them, else polling the parent
    pid once a second), then end this process."""
    try:
        pidfd = os.pidfd_open(parent_pid)
    except (AttributeError, OSError):  # no pidfd (old kernel, not Linux) or the parent is already gone
        while os.getppid() == parent_pid:
            time.sleep(1.0)
    else:
        select.select([pidfd], [], [])
    os._exit(0)


def _die_with_parent(parent_pid: int, forked_on_main_thread: bool) -> None:
    """In the child: end it when the parent process ends (see the module docstring)."""
    if not (forked_on_main_thread and _set_parent_death_signal()):
        threading.Thread(target=_exit_when_parent_ends, args=(parent_pid,), daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the signal was asked for
        os._exit(0)


def _serve(fn: Callable[..., Any], conn: Any, parent_end: Any, parent_pid: int, forked_on_main_thread: bool) -> None:
    """The child's loop: one call per message until the pipe closes (the parent closed it, or died)."""
    parent_end.close()  # else the child holds its own pipe open and never sees the parent's end-of-file
    _die_with_parent(parent_pid, forked_on_main_thread)
    while True:
        try:
            kwargs = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        try:
            conn.send(("ok", fn(**kwargs)))
        except BaseException as exc:  # SystemExit included: a function that calls sys.exit() is an error too
            conn.send(("error", type(exc).__name__, str(exc), traceback.format_exc()))


class IsolatedFunction:
    """`fn(**kwargs)` run in a forked child process (see the module docstring), each call within `timeout_s`."""

    def __init__(self, fn: Callable[..., Any], timeout_s: float | None = None) -> None:
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"reward_model.timeout_s={timeout_s} must be positive seconds, or None for no limit.")
        self.fn, self.timeout_s = fn, timeout_s
        self._process: Any = None
        self._conn: Any = None

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")
        _prctl()  # looked up here, not in the child
        parent_conn, child_conn = context.Pipe()
        on_main_thread = threading.current_thread() is threading.main_thread()
        args = (self.fn, child_conn, parent_conn, os.getpid(), on_main_thread)
        self._process = context.Process(target=_serve, args=args, daemon=True)
        self._process.start()
        child_conn.close()
        self._conn = parent_conn

    def close(self) -> None:
        """Stop the child process (a new one starts on the next call)."""
        if self._process is not None:
            self._conn.close()
            self._process.kill()
            self._process.join()
            self._process = self._conn = None

    def __call__(self, **kwargs: Any) -> Any:
        if self._process is None or not self._process.is_alive():
            self.close()
            self._start()
        try:
            self._conn.send(kwargs)
            ready = self._conn.poll(self.timeout_s)
            message = self._conn.recv() if ready else None
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._process.join(timeout=5)
            exit_code = self._process.exitcode
            self.close()
            raise FunctionCrashed(exit_code) from None
        if message is None:
            self.close()
            raise FunctionTimedOut(f"no result within {self.timeout_s}s")
        if message[0] == "error":
            raise FunctionRaised(*message[1:])
        return message[1]

    def __getstate__(self) -> dict[str, Any]:
        return {"fn": self.fn, "timeout_s": self.timeout_s, "_process": None, "_conn": None}
