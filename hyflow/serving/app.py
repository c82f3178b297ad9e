"""The FastAPI app of `hyflow serve`: routes, OpenAI-shaped errors, streaming, limits.

The async engine's step loop runs on the app's own event loop (started by the first request), its forward steps
in a worker thread. A request whose client disconnects is aborted in the engine; one that runs longer than
`--request-timeout` is aborted and answered 408 (in a stream: an error event); a body larger than
`--max-request-bytes` is refused with 413 (by its Content-Length before it is read, or once a chunked body passes
it); request bodies are read by `body.py` (UTF-8, nesting depth, lone surrogates).
Errors are `{"error": {"message", "type", "param", "code"}}` with the HTTP status: 400 bad request (naming the key,
the value and the fix), 404 unknown model or route, 408 timeout, 413 body too large, 500 a server fault (logged
with its traceback; every response, 500s included, is counted in /metrics).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

import hyflow
from hyflow.serving.body import JSONBodyRoute
from hyflow.serving.chat import create_chat_completion, stream_chat_completion
from hyflow.serving.completions import create_completion, stream_completion
from hyflow.serving.errors import BadRequest
from hyflow.serving.limits import BodyLimitMiddleware, ClientGone, RequestCounter, run_until_disconnect
from hyflow.serving.requests import template_messages
from hyflow.serving.schema import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from hyflow.serving.state import ServingState

logger = logging.getLogger(__name__)

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    408: "TimeoutError",
    413: "RequestTooLargeError",
    500: "InternalServerError",
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": _ERROR_TYPES.get(status, "ServerError"), "param": param, "code": status}
    }


def _validation_message(error: RequestValidationError) -> str:
    parts = []
    for item in error.errors():
        if item.get("type") == "json_invalid":
            return f"the request body is not JSON ({item['ctx']['error']} at character {item['loc'][-1]})"
        where = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
        value = item.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r:.80})"
        parts.append(f"{where or 'body'}: {item.get('msg')}{shown}")
    return "invalid request: " + "; ".join(parts)


class _CountedApp(FastAPI):
    """FastAPI with `RequestCounter` around its whole middleware stack: Starlette's ServerErrorMiddleware, which
    answers an unhandled error with 500, sits outside every middleware added with `add_middleware`."""

    def build_middleware_stack(self) -> Any:
        return RequestCounter(super().build_middleware_stack(), self.state.serving.metrics)


def _bad_request_response(error: BadRequest) -> JSONResponse:
    return JSONResponse(error_body(error.status, str(error), error.param), status_code=error.status)


def build_app(state: ServingState) -> FastAPI:
    app = _CountedApp(title="hyflow serve", version=hyflow.__version__)
    app.router.route_class = JSONBodyRoute
    app.add_middleware(BodyLimitMiddleware, max_bytes=state.limits.max_request_bytes)
    app.state.serving = state

    @app.exception_handler(BadRequest)
    async def bad_request(_: Request, error: BadRequest) -> JSONResponse:
        return _bad_request_response(error)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(400, _validation_message(error)), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        if isinstance(error.__cause__, BadRequest):  # FastAPI's generic 400 for a body it could not read (body.py)
            return _bad_request_response(error.__cause__)
        message = f"{error.detail}: {request.method} {request.url.path}"
        return JSONResponse(error_body(error.status_code, message), status_code=error.status_code)

    @app.exception_handler(Exception)
    async def server_error(_: Request, error: Exception) -> JSONResponse:
        message = f"internal server error ({type(error).__name__}); the server's log has the traceback"
        return JSONResponse(error_body(500, message), status_code=500)

    _add_info_routes(app, state)
    _add_generation_routes(app, state)
    return app


def _check_model(state: ServingState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise BadRequest(
            f"The model {model!r} does not exist; this server serves {state.model_name!r} (GET /v1/models)",
            "model",
            status=404,
        )


def _model_card(state: ServingState) -> dict[str, Any]:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "hyflow",
        "max_model_len": state.max_model_len,
    }


def _add_info_routes(app: FastAPI, state: ServingState) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": hyflow.__version__}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        _check_model(state, model_id)
        return _model_card(state)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> dict[str, Any]:
        _check_model(state, request.model)
        if (request.prompt is None) == (request.messages is None):
            raise BadRequest("give exactly one of 'prompt' and 'messages'", "prompt")
        tokenizer, run = state.tokenizer, state.preparer.run  # off the event loop (preparation.py)
        if request.messages is not None:
            text = await run(
                tokenizer.apply_chat_template,
                template_messages(request.messages),
                add_generation_prompt=request.add_generation_prompt,
                tokenize=False,
            )
            tokens = await run(tokenizer.encode, text, add_special_tokens=False)
        else:
            tokens = await run(tokenizer.encode, request.prompt, add_special_tokens=request.add_special_tokens)
        return {"tokens": list(tokens), "count": len(tokens), "max_model_len": state.max_model_len}

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest) -> dict[str, str]:
        _check_model(state, request.model)
        vocab = state.vocab_size
        bad = [t for t in request.tokens if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", "tokens")
        return {"prompt": state.tokenizer.decode(request.tokens)}


def _add_generation_routes(app: FastAPI, state: ServingState) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        _check_model(state, body.model)
        if body.stream:
            return await _stream(request, state, stream_completion(state, body))
        return await _answer(request, state, create_completion(state, body))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        _check_model(state, body.model)
        if body.stream:
            return await _stream(request, state, stream_chat_completion(state, body))
        return await _answer(request, state, create_chat_completion(state, body))


def _timeout_error(state: ServingState) -> BadRequest:
    return BadRequest(
        f"the request ran longer than the server's --request-timeout of {state.limits.request_timeout:g} s and was "
        "aborted; ask for fewer tokens, or restart the server with a longer --request-timeout",
        status=408,
    )


async def _answer(request: Request, state: ServingState, work: Awaitable[dict[str, Any]]) -> Response:
    started = time.monotonic()
    try:
        body = await run_until_disconnect(request, work, state.limits.request_timeout)
    except TimeoutError:
        raise _timeout_error(state) from None
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; the engine's requests are aborted
    state.metrics.latency.observe(time.monotonic() - started)
    return JSONResponse(body)


def _has_tokens(chunk: dict[str, Any]) -> bool:
    for choice in chunk["choices"]:
        delta = choice.get("delta", {})
        if choice.get("text") or delta.get("content") or delta.get("tool_calls"):
            return True
    return False


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _stream(request: Request, state: ServingState, chunks: AsyncIterator[dict[str, Any]]) -> Response:
    """Server-sent events. The first chunk is awaited before the response starts, so a bad request still gets
    its HTTP status (400, 404, 408); later failures end the stream with an error event."""
    started = time.monotonic()
    deadline = started + state.limits.request_timeout
    try:
        first = await run_until_disconnect(request, anext(chunks), state.limits.request_timeout)
    except TimeoutError:
        await chunks.aclose()
        raise _timeout_error(state) from None
    except ClientGone:
        await chunks.aclose()
        return Response(status_code=499)
    except BaseException:
        await chunks.aclose()
        raise

    async def events() -> AsyncIterator[str]:
        seen_tokens = _has_tokens(first)
        if seen_tokens:
            state.metrics.ttft.observe(time.monotonic() - started)
        try:
            yield _event(first)
            async with asyncio.timeout_at(asyncio.get_running_loop().time() + deadline - time.monotonic()):
                async for chunk in chunks:
                    if not seen_tokens and _has_tokens(chunk):
                        seen_tokens = True
                        state.metrics.ttft.observe(time.monotonic() - started)
                    yield _event(chunk)
            state.metrics.latency.observe(time.monotonic() - started)
        except TimeoutError:
            yield _event(error_body(408, str(_timeout_error(state))))
        except BadRequest as error:
            yield _event(error_body(error.status, str(error), error.param))
        finally:
            await chunks.aclose()  # a client gone mid-stream lands here too: its engine requests are aborted
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
