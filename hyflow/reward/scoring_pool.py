"""`ScoringPool`: run a scoring function over many inputs in worker processes, with a per-call timeout, and
survive workers that hang or die.

    pool = ScoringPool(num_processes=8, timeout=300)
    outcomes = pool.run(compute_score, [{"data_source": ..., "solution_str": ..., ...}, ...])
    # [Outcome(status="ok", value=1.0), Outcome(status="timeout"), Outcome(status="crash"), ...]

How it stays alive (on top of `concurrent.futures.ProcessPoolExecutor`):
- at most `num_processes` calls are in flight, so each call starts when it is submitted and its clock is honest;
- a call past its timeout: the pool's processes are killed (a hung process cannot be cancelled otherwise), the
  call is marked `timeout`, the pool is rebuilt and the other in-flight calls are submitted again;
- a worker that dies (`os._exit`, a segfault, the OOM killer) breaks the whole pool (`BrokenProcessPool`) without
  saying which call killed it: the calls that were in flight are run again one at a time in a fresh pool, and the
  one that breaks it alone is marked `crash`;
- a call that raises is marked `error` with the exception's text.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Literal

logger = logging.getLogger(__name__)

Status = Literal["ok", "timeout", "crash", "error"]


@dataclass
class Outcome:
    """Result of one call: `value` when `status == "ok"`, else `error` says what went wrong."""

    status: Status
    value: Any = None
    error: str = ""


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    return fn(**kwargs)


class ScoringPool:
    """A process pool that gives every call an `Outcome` within about `timeout` seconds of its start."""

    def __init__(self, num_processes: int, timeout: float, start_method: str = "spawn") -> None:
        if num_processes < 1:
            raise ValueError(f"reward_model.num_processes={num_processes} must be >= 1.")
        if timeout <= 0:
            raise ValueError(f"reward_model.timeout={timeout} must be positive (seconds per response).")
        self.num_processes, self.timeout, self.start_method = num_processes, timeout, start_method
        self._executor: ProcessPoolExecutor | None = None

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            context = multiprocessing.get_context(self.start_method)
            self._executor = ProcessPoolExecutor(max_workers=self.num_processes, mp_context=context)
        return self._executor

    def _kill(self) -> None:
        """Kill the worker processes and drop the executor (a fresh one is made on the next submit)."""
        if self._executor is None:
            return
        # No public way to stop a busy worker before Python 3.14's kill_workers(); _processes is the pid->Process map.
        processes = list((getattr(self._executor, "_processes", None) or {}).values())
        for process in processes:
            process.kill()
        for process in processes:
            process.join(timeout=5)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._executor = None

    def close(self) -> None:
        """Stop the worker processes."""
        self._kill()

    def run(self, fn: Callable[..., Any], calls: list[dict[str, Any]]) -> list[Outcome]:
        """`fn(**kwargs)` for each kwargs of `calls` (fn must be picklable), in order, one `Outcome` each."""
        outcomes: list[Outcome | None] = [None] * len(calls)
        suspects = self._run_phase(fn, calls, deque(range(len(calls))), outcomes, self.num_processes)
        if suspects:
            logger.warning("a scoring worker died; re-running %d in-flight responses one at a time", len(suspects))
            left = self._run_phase(fn, calls, deque(sorted(suspects)), outcomes, 1)
            assert not left, "a call run alone is either done or marked crash"
        assert all(outcome is not None for outcome in outcomes)
        return outcomes  # type: ignore[return-value]

    def _run_phase(
        self,
        fn: Callable[..., Any],
        calls: list[dict[str, Any]],
        pending: deque[int],
        outcomes: list[Outcome | None],
        parallel: int,
    ) -> list[int]:
        """Run `pending` with up to `parallel` calls in flight; return calls that were in flight when a worker
        died among others (to be re-run alone). With one call in flight, the one that breaks the pool is `crash`."""
        suspects: list[int] = []
        in_flight: dict[Future, tuple[int, float]] = {}
        while pending or in_flight:
            while pending and len(in_flight) < parallel:
                index = pending.popleft()
                in_flight[self._pool().submit(_call, fn, calls[index])] = (index, time.monotonic())
            next_deadline = min(start for _, start in in_flight.values()) + self.timeout
            done, _ = wait(in_flight, timeout=max(0.0, next_deadline - time.monotonic()), return_when=FIRST_COMPLETED)
            broken = self._collect(done, in_flight, outcomes)
            if broken:
                broken += [index for index, _ in in_flight.values()]  # the dead pool fails every other call too
                in_flight.clear()
                self._kill()
                if len(broken) == 1:
                    outcomes[broken[0]] = Outcome("crash", error="the worker process died")
                else:
                    suspects += broken
                continue
            now = time.monotonic()
            expired = [future for future, (_, start) in in_flight.items() if now - start >= self.timeout]
            if expired:
                for future in expired:
                    outcomes[in_flight.pop(future)[0]] = Outcome("timeout", error=f"no result after {self.timeout}s")
                pending.extendleft(index for index, _ in in_flight.values())
                in_flight.clear()
                self._kill()
        return suspects

    @staticmethod
    def _collect(
        done: set[Future], in_flight: dict[Future, tuple[int, float]], outcomes: list[Outcome | None]
    ) -> list[int]:
        """Record finished calls; return the indices whose future failed because the pool broke."""
        broken = []
        for future in done:
            index, _ = in_flight.pop(future)
            try:
                outcomes[index] = Outcome("ok", value=future.result())
            except BrokenProcessPool:
                broken.append(index)
            except Exception as exc:
                outcomes[index] = Outcome("error", error=f"{type(exc).__name__}: {exc}")
        return broken
