"""Errors a worker group raises in the controller when something goes wrong on a worker.

Every error names the worker's rank and the method that was running, so a failure on rank 3 of 8 reads as
one clear message in the controller rather than a stack trace from deep inside a remote process:

- `WorkerError`: the worker method raised; carries the remote traceback text.
- `WorkerDiedError`: the worker process went away (crash, `os._exit`, OOM kill) while running the method.
- `WorkerTimeoutError`: the call did not finish within its timeout.

All three derive from `WorkerGroupError`, so a caller can catch the family with one `except`.

`ControllerUsageError` is a misuse of the controller's API in the caller's own code (a mesh registered twice,
nothing to put): a ValueError, and an AssertionError too, because verl asserts in the same places, so ported code
that catches either keeps working.
"""

from __future__ import annotations


class WorkerGroupError(RuntimeError):
    """Base class of the errors a worker group raises for a failed call."""

    def __init__(self, message: str, *, rank: int, method: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.method = method


class WorkerError(WorkerGroupError):
    """A worker method raised an exception; `remote_traceback` holds the worker's traceback text."""

    def __init__(self, *, rank: int, method: str, remote_traceback: str, cause_type: str = "") -> None:
        kind = f" ({cause_type})" if cause_type else ""
        message = (
            f"worker rank {rank} raised{kind} in {method!r}.\n"
            f"--- traceback from the worker ---\n{remote_traceback.rstrip()}\n--- end of worker traceback ---"
        )
        super().__init__(message, rank=rank, method=method)
        self.remote_traceback = remote_traceback
        self.cause_type = cause_type


class WorkerDiedError(WorkerGroupError):
    """A worker process died while a method was running on it (it never returned)."""

    def __init__(self, *, rank: int, method: str, node: str, detail: str = "") -> None:
        message = f"worker rank {rank} on node {node} died during {method!r}"
        if detail:
            message += f": {detail.strip().splitlines()[0].rstrip('.')}"
        message += (
            ". The process exited without returning (a crash, os._exit, or the OS killed it for memory); "
            "look at that worker's log for the cause."
        )
        super().__init__(message, rank=rank, method=method)
        self.node = node


class WorkerTimeoutError(WorkerGroupError):
    """A call did not finish within its timeout; `ranks` / `nodes` are the workers that had not answered."""

    def __init__(
        self, *, ranks: list[int], method: str, timeout_s: float, nodes: list[str], world_size: int | None = None
    ) -> None:
        silent = ", ".join(f"rank {rank} on node {node}" for rank, node in zip(ranks, nodes, strict=True))
        of = f" of {world_size}" if world_size is not None else ""
        message = (
            f"{len(ranks)}{of} worker(s) did not finish {method!r} within {timeout_s:g} s: {silent}. A worker "
            "that stopped responding (stopped, swapped out, or stuck in a collective waiting for a rank that never "
            "joined) is the usual cause; look at those workers' logs (py-spy dump --pid shows where a live one is "
            "stuck). If the work is just slow, raise the limit: trainer.worker_call_timeout_s "
            "(trainer.worker_init_timeout_s for loading the models), or `timeout=` on the call."
        )
        super().__init__(message, rank=ranks[0], method=method)
        self.ranks = list(ranks)
        self.nodes = list(nodes)
        self.timeout_s = timeout_s


class ControllerUsageError(ValueError, AssertionError):
    """The controller's API was called in a way it does not allow; the message names the value and the fix."""
