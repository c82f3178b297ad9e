"""`run_hook`: one call of a tool hook (create / execute / calc_reward / release), bounded and isolated.

Tool code is untrusted in two ways that asyncio alone cannot contain: a coroutine that blocks (a synchronous
`time.sleep` or `requests.get` inside `async def`) stalls the event loop it runs on, so no timeout on that loop can
fire; and a `BaseException` that is not an `Exception` (`SystemExit`, `KeyboardInterrupt`, `GeneratorExit`) escapes
every `except Exception` and ends the batch. So each hook call runs in a worker thread of its own, on an event loop
of its own (`asyncio.run` there), and the agent loop's event loop only awaits a future:

    value = await run_hook("calculator", "execute", partial(tool.execute, instance_id, arguments), timeout=30)

- the call returns: its value;
- the hook raised anything (any `BaseException`, also `asyncio.CancelledError` from the tool's own code): a
  `ToolHookError` with `kind="raised"` whose text names it;
- `timeout` seconds passed: the worker's task is cancelled and a `ToolHookError` with `kind="timeout"` is raised.
  When the worker's thread has not finished `ABANDON_GRACE_S` seconds after the cancel (blocked in synchronous
  code, or still joining a thread the hook started), it is left behind (a daemon thread; `abandoned=True`), and the
  caller stops using that tool instance.

At most `MAX_CONCURRENT_HOOKS` calls run at once per caller's event loop (each holds a thread and a loop's file
descriptors); the others wait for a slot, and the wait does not count toward their timeout.

Cancelling the awaiting task (the episode is cancelled) cancels the worker's task and raises `CancelledError` in
the caller as usual. Consequence for tool authors: a hook runs on a short-lived event loop, so asyncio objects (a
`Lock`, a `Semaphore`, a client session) shared between calls must not be bound to one loop: use `threading`
primitives for limits shared across calls (as `SearchTool` does), or create the asyncio object inside the call;
and calls of one tool object run at the same time on different threads, so a read-modify-write of state on `self`
needs a `threading.Lock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ABANDON_GRACE_S", "MAX_CONCURRENT_HOOKS", "HookKind", "HookName", "ToolHookError", "run_hook"]

HookName = Literal["create", "execute", "calc_reward", "release"]
HookKind = Literal["timeout", "raised"]
ABANDON_GRACE_S = 1.0  # after a timeout, how long a cancelled hook may take to finish before its thread is left
MAX_CONCURRENT_HOOKS = 256  # hook calls running at once per caller's event loop (a thread and ~3 descriptors each)
_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


class ToolHookError(Exception):
    """A hook call that timed out or raised. `str(error)` is the text the model reads (after the error prefix)."""

    def __init__(self, tool: str, hook: HookName, kind: HookKind, text: str, abandoned: bool = False) -> None:
        super().__init__(text)
        self.tool, self.hook, self.kind, self.abandoned = tool, hook, kind, abandoned


@dataclass
class _Outcome:
    value: Any = None
    error: BaseException | None = None


def describe_error(tool: str, error: BaseException) -> str:
    """What the model reads for a hook that raised: an `Exception`'s message (its type when it has none), else
    "<tool> raised <type>: <message>" (SystemExit, KeyboardInterrupt, CancelledError, ...)."""
    message = str(error)
    if isinstance(error, Exception) and not isinstance(error, asyncio.CancelledError) and message:
        return message
    return f"{tool} raised {type(error).__name__}" + (f": {message}" if message else "")


class _Worker:
    """One hook call on its own thread and event loop; reports its outcome to `done` on the caller's loop."""

    def __init__(self, call: Callable[[], Any], caller: asyncio.AbstractEventLoop, name: str) -> None:
        self.call, self.caller = call, caller
        self.done: asyncio.Future[_Outcome] = caller.create_future()
        self._lock = threading.Lock()
        self._cancelled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        context = contextvars.copy_context()
        self.thread = threading.Thread(target=context.run, args=(self._main,), name=name, daemon=True)

    def _report(self, outcome: _Outcome) -> None:
        def settle() -> None:
            if not self.done.done():
                self.done.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits for this call any more
            self.caller.call_soon_threadsafe(settle)

    def _main(self) -> None:
        """The thread: the hook on a loop of its own; the outcome is reported once the loop is shut down (its
        leftover tasks cancelled, its executor threads joined), so a finished call is a finished thread."""
        try:
            outcome = asyncio.run(self._drive())
        except BaseException as error:  # a SystemExit from a task the tool started stops the loop itself
            outcome = _Outcome(error=error)
        self._report(outcome)

    async def _drive(self) -> _Outcome:
        with self._lock:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            cancelled = self._cancelled
        try:
            if cancelled:
                raise asyncio.CancelledError
            value = self.call()
            if inspect.isawaitable(value):
                value = await value
        except BaseException as error:  # tool code: whatever it raises is reported, never raised
            return _Outcome(error=error)
        return _Outcome(value=value)

    def cancel(self) -> None:
        """Cancel the hook's task on the worker's loop (it takes effect when the hook next awaits)."""
        with self._lock:
            self._cancelled = True
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the worker's loop already finished
                loop.call_soon_threadsafe(task.cancel)


async def _finishes_within(done: asyncio.Future, seconds: float) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(done), seconds)
    except TimeoutError:
        return False
    return True


async def run_hook(
    tool: str, hook: HookName, call: Callable[[], Any], timeout: float, grace: float | None = None
) -> Any:
    """`call()` (a hook call; awaited when it returns an awaitable) on a worker thread and event loop of its own,
    within `timeout` seconds; see the module docstring for what it returns and raises. `grace`: seconds a
    timed-out call may take to finish once cancelled (default `ABANDON_GRACE_S`)."""
    caller = asyncio.get_running_loop()
    if caller not in _SLOTS:
        _SLOTS[caller] = asyncio.Semaphore(MAX_CONCURRENT_HOOKS)
    async with _SLOTS[caller]:
        return await _run_in_worker(_Worker(call, caller, name=f"tool-{tool}-{hook}"), tool, hook, timeout, grace)


async def _run_in_worker(worker: _Worker, tool: str, hook: HookName, timeout: float, grace: float | None) -> Any:
    worker.thread.start()
    try:
        outcome = await asyncio.wait_for(asyncio.shield(worker.done), timeout)
    except TimeoutError:
        worker.cancel()
        abandoned = not await _finishes_within(worker.done, ABANDON_GRACE_S if grace is None else grace)
        where = tool if hook == "execute" else f"{tool}.{hook}"
        raise ToolHookError(tool, hook, "timeout", f"{where} timed out after {timeout:g} seconds", abandoned) from None
    except asyncio.CancelledError:
        worker.cancel()
        raise
    if outcome.error is not None:
        raise ToolHookError(tool, hook, "raised", describe_error(tool, outcome.error)) from outcome.error
    return outcome.value
