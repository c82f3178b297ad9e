"""run_until_disconnect: a request's work runs at once in its own task, within the timeout, until the client goes."""

from __future__ import annotations

import asyncio

import pytest

from hyflow.serving.limits import ClientGone, run_until_disconnect


class Request:
    """The part of a Starlette request the watcher reads: `receive()` answers once the client has gone."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}


def test_the_work_runs_in_the_calling_task_ahead_of_what_was_queued_before_it():
    async def main():
        order = []

        async def work():
            order.append(("work", asyncio.current_task()))
            return 7

        asyncio.get_running_loop().call_soon(order.append, "queued earlier")  # another request's callback, say
        result = await run_until_disconnect(Request(), work(), timeout_s=30)
        return result, order, asyncio.current_task()

    result, order, task = asyncio.run(main())
    assert result == 7 and order[0] == ("work", task)


def test_a_client_that_disconnects_cancels_the_work_and_raises_client_gone():
    async def main():
        request, cancelled = Request(), []

        async def work():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        asyncio.get_running_loop().call_later(0.01, request.gone.set)
        with pytest.raises(ClientGone):
            await run_until_disconnect(request, work(), timeout_s=30)
        await asyncio.sleep(0)  # the caller goes on: no cancellation is left pending on it
        return cancelled, asyncio.current_task().cancelling()

    assert asyncio.run(main()) == ([True], 0)


def test_work_that_outlasts_the_timeout_raises_timeout_error():
    async def main():
        with pytest.raises(TimeoutError):
            await run_until_disconnect(Request(), asyncio.sleep(60), timeout_s=0.01)

    asyncio.run(main())
