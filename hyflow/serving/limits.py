"""What protects the server from its clients: a cap on request bodies, the per-route request count (every answer,
the 500s of Starlette's own error middleware included), and waiting for a result only while the client is still
connected."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hyflow.serving.errors import BadRequest
from hyflow.serving.metrics import ServerMetrics

logger = logging.getLogger(__name__)
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


class BodyTooLarge(BadRequest):
    """A request body past `--max-request-bytes` (HTTP 413), found while reading it."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(
            f"the request body is larger than the server's limit of {max_bytes} bytes; send less, or restart the "
            "server with a larger --max-request-bytes",
            status=413,
        )


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


def _endpoint(path: str) -> str:
    return path if path in _ROUTES else "/v1/models/{id}" if path.startswith("/v1/models/") else "other"


class RequestCounter:
    """The outermost ASGI layer (around Starlette's ServerErrorMiddleware, see `hyflow.serving.app`): counts every
    response per route and status, and as a 500 a request that raised before any response started (uvicorn then
    answers 500 itself). An error raised after its response started (ServerErrorMiddleware re-raises the one it
    answered with 500) is logged here, with its traceback, and not passed on: uvicorn would close the connection."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint, started = _endpoint(scope["path"]), False

        async def counted_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.http_requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        except BaseException as error:
            if not started:
                self.metrics.http_requests.labels(endpoint, "500").inc()  # uvicorn answers 500
                raise
            if not isinstance(error, Exception):
                raise  # cancelled: the server is stopping
            logger.exception("hyflow serve: %s %s failed", scope.get("method"), scope["path"])


class BodyLimitMiddleware:
    """A plain ASGI middleware (no buffering, streaming passes through): refuses bodies over `max_bytes` with 413,
    by Content-Length before reading, or while reading a chunked body (`BodyTooLarge` raised from `receive`; the
    app answers it when its body parser is the reader, this middleware otherwise)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _refuse(send, BodyTooLarge(self.max_bytes))
            return
        received, started = 0, False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except BodyTooLarge as error:
            if not started:
                await _refuse(send, error)


async def _refuse(send: Send, error: BadRequest) -> None:
    body = json.dumps({"error": {"message": str(error), "type": "RequestTooLargeError", "param": None, "code": 413}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})
