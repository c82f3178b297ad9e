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


async def run_until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`await work`, unless the client disconnects first: then `work` is cancelled (which aborts its engine
    requests) and ClientGone is raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)  # let it abort its engine requests
    raise ClientGone


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
