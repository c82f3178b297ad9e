"""run_hook: a tool hook on a worker thread and event loop of its own, bounded, every exception reported."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hyflow.agent.tools import hook_runner
from hyflow.agent.tools.hook_runner import ToolHookError, run_hook

pytestmark = pytest.mark.timeout(60)


def test_a_hook_returns_its_value_from_a_loop_and_thread_of_its_own():
    main_thread = threading.get_ident()

    async def hook():
        await asyncio.sleep(0)
        return threading.get_ident(), asyncio.get_running_loop()

    async def caller():
        return await run_hook("t", "execute", hook, timeout=5), asyncio.get_running_loop()

    (hook_thread, hook_loop), caller_loop = asyncio.run(caller())
    assert hook_thread != main_thread and hook_loop is not caller_loop
    assert asyncio.run(run_hook("t", "calc_reward", lambda: 1.5, timeout=5)) == 1.5  # a plain function works too


def test_a_blocking_hook_is_cut_off_while_the_callers_loop_keeps_running():
    gate = threading.Event()
    ticks = []

    async def blocking_hook():
        gate.wait(10)  # synchronous: it would stall any loop it ran on

    async def ticker():
        while not gate.is_set():
            ticks.append(1)
            await asyncio.sleep(0.01)

    async def caller():
        ticking = asyncio.create_task(ticker())
        try:
            with pytest.raises(ToolHookError) as raised:
                await run_hook("t", "create", blocking_hook, timeout=0.2, grace=0.1)
            return raised.value
        finally:
            gate.set()
            await ticking

    error = asyncio.run(caller())
    assert (error.hook, error.kind, error.abandoned) == ("create", "timeout", True)
    assert str(error) == "t.create timed out after 0.2 seconds"
    assert len(ticks) > 1  # the caller's loop ran while the hook blocked


@pytest.mark.parametrize(
    "error, text",
    [
        (SystemExit(3), "t raised SystemExit: 3"),
        (KeyboardInterrupt(), "t raised KeyboardInterrupt"),
        (GeneratorExit(), "t raised GeneratorExit"),
        (asyncio.CancelledError(), "t raised CancelledError"),
        (RuntimeError("disk on fire"), "disk on fire"),
    ],
)
def test_anything_a_hook_raises_becomes_a_tool_hook_error_naming_it(error, text):
    async def hook():
        raise error

    with pytest.raises(ToolHookError) as raised:
        asyncio.run(run_hook("t", "release", hook, timeout=5))
    assert (raised.value.kind, str(raised.value)) == ("raised", text)


def test_a_system_exit_in_a_task_the_hook_started_is_reported_not_raised():
    async def exits():
        raise SystemExit(4)

    async def hook():
        await asyncio.gather(asyncio.create_task(exits()))

    with pytest.raises(ToolHookError, match=r"^t raised SystemExit: 4$"):
        asyncio.run(run_hook("t", "execute", hook, timeout=5))


def test_cancelling_the_caller_cancels_the_hook_and_raises_cancelled_error():
    started, hook_cancelled = threading.Event(), threading.Event()

    async def hook():
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            hook_cancelled.set()
            raise

    async def caller():
        task = asyncio.create_task(run_hook("t", "execute", hook, timeout=30))
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await asyncio.to_thread(hook_cancelled.wait, 5)

    assert asyncio.run(caller())


def test_at_most_max_concurrent_hooks_run_at_once_and_the_others_wait_for_a_slot(monkeypatch):
    monkeypatch.setattr(hook_runner, "MAX_CONCURRENT_HOOKS", 2)
    lock, running, peak = threading.Lock(), [0], [0]

    async def hook(i):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.05)
        with lock:
            running[0] -= 1
        return i

    async def caller():
        return await asyncio.gather(*(run_hook("t", "execute", lambda i=i: hook(i), timeout=30) for i in range(5)))

    assert asyncio.run(caller()) == [0, 1, 2, 3, 4]
    assert peak[0] == 2
