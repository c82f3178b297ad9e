"""What protects the server from its clients: a cap on request bodies, the per-route request count, and waiting
for a result only while the client is still connected."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hyflow.serving.metrics import ServerMetrics

T = TypeVar("T")

_ROUTES = {
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/health",
    "/version",
    "/tokenize",
    "/detokenize",
    "/metrics",
}


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


class _TooLarge(Exception):
    pass


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_until_disconnect(request: Request, work: Awaitable[T], timeout_s: float) -> T:
    """`await work` within `timeout_s` (TimeoutError after), unless the client disconnects first: then `work` is
    cancelled (which aborts its engine requests) and ClientGone is raised.

    `work` runs in the calling task, not a task of its own: a new task would start only after every callback
    already queued on the event loop, so in a burst each request's engine admission would wait until all the
    requests behind it had been parsed, and the engine would start on none of them before the last one arrived.
    A watcher task cancels the caller when the client goes."""
    task = asyncio.current_task()
    assert task is not None, "run_until_disconnect runs inside a task"
    gone = False

    async def cancel_when_gone() -> None:
        nonlocal gone
        await _wait_for_disconnect(request)
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(cancel_when_gone())
    try:
        async with asyncio.timeout(timeout_s):
            return await work
    except asyncio.CancelledError:
        if not gone:
            raise  # cancelled from outside (the server stopping): not ours to swallow
        task.uncancel()
        raise ClientGone from None
    finally:
        watcher.cancel()


class GuardMiddleware:
    """A plain ASGI middleware (no buffering, streaming passes through): refuses bodies over `max_bytes` with 413
    (by Content-Length before reading, or while reading a chunked body), and counts requests per route and status."""

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: ServerMetrics) -> None:
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in _ROUTES else "/v1/models/{id}" if path.startswith("/v1/models/") else "other"
        status: dict[str, Any] = {}

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                self.metrics.http_requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(counted_send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited_receive, counted_send)
        except _TooLarge:
            if "code" not in status:
                await self._refuse(counted_send)

    async def _refuse(self, send: Send) -> None:
        message = (
            f"the request body is larger than the server's limit of {self.max_bytes} bytes; send less, or restart "
            "the server with a larger --max-request-bytes"
        )
        body = json.dumps({"error": {"message": message, "type": "RequestTooLargeError", "param": None, "code": 413}})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})
