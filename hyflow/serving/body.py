"""A request body as JSON, or a 400 that says what is wrong with it: not UTF-8, nested too deep, or a string with a
lone surrogate (`"\\ud800"` is valid JSON but no text: the tokenizer cannot encode it), naming the field.

The app's routes read their bodies through `JSONBodyRoute`, so FastAPI validates what `parse_json_body` returns.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from hyflow.serving.errors import BadRequest

MAX_JSON_DEPTH = 100  # a tool's parameter schema nests two levels per object; nothing an API call sends comes close

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # how a surrogate can reach a strictly decoded UTF-8 body
_SURROGATE = re.compile("[\ud800-\udfff]")
_NESTED = (str, dict, list)


def parse_json_body(body: bytes) -> Any:
    """`body` (UTF-8 JSON) as Python values. BadRequest when it is not UTF-8, nests deeper than `MAX_JSON_DEPTH`, or
    holds a lone surrogate (param: the field's path, e.g. `messages[0].content`); json.JSONDecodeError when it is
    not JSON (FastAPI answers that one)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadRequest(
            f"the request body is not valid UTF-8 (byte {body[error.start]:#04x} at offset {error.start}: "
            f"{error.reason}); send JSON encoded as UTF-8",
            "body",
        ) from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep() from None
    may_nest = text.count("[") + text.count("{") > MAX_JSON_DEPTH
    if may_nest or _SURROGATE_ESCAPE.search(text):
        _check_values(value)
    return value


def _too_deep() -> BadRequest:
    return BadRequest(
        f"the request body's JSON nests deeper than {MAX_JSON_DEPTH} levels, which hyflow serve does not read; "
        "send flatter JSON",
        "body",
    )


def _path(parts: tuple[str | int, ...]) -> str:
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts)
    return text.removeprefix(".") or "body"


def _refuse_surrogate(text: str, where: str) -> None:
    found = _SURROGATE.search(text)
    if found:
        raise BadRequest(
            f"{where} holds a lone surrogate ({found.group()!r} at character {found.start()}), which is not text; "
            "send valid Unicode (a surrogate only as half of an escaped pair such as '\\ud83d\\ude00')",
            where,
        )


def _check_values(value: Any) -> None:
    """Walks the parsed body (iteratively: its depth is what is checked) for its depth and lone surrogates."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, parts = stack.pop()
        if isinstance(item, str):
            _refuse_surrogate(item, _path(parts))
            continue
        if len(parts) >= MAX_JSON_DEPTH:
            raise _too_deep()
        if isinstance(item, dict):
            for key, child in item.items():
                _refuse_surrogate(key, f"a key of {_path(parts)}")
                if isinstance(child, _NESTED):
                    stack.append((child, (*parts, key)))
        elif isinstance(item, list):
            stack.extend((child, (*parts, index)) for index, child in enumerate(item) if isinstance(child, _NESTED))


class _JSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json_body(await self.body())
        return self._json


class JSONBodyRoute(APIRoute):
    """An APIRoute whose JSON body is read by `parse_json_body`. FastAPI wraps any error of its body reading in a
    generic 400 ("There was an error parsing the body") caused by the original error: the app's HTTPException
    handler answers with that cause when it is a BadRequest."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def read_json_body(request: Request) -> Response:
            return await handler(_JSONRequest(request.scope, request.receive))

        return read_json_body
