"""The per-rollout OpenAI endpoint of the `openai_agent` loop: a FastAPI app over one `RolloutEndpoint`, reached by
an `openai.AsyncOpenAI` client through httpx's ASGI transport (in process, no socket, on the loop's event loop).

Only `POST /v1/chat/completions`, not streamed, one choice: what agent programs send. Requests are read with the
server's schema (hyflow.serving.schema), so keys hyflow does not know are refused the same way. Content is text:
an image or video part is refused with a 400 (the trajectory would hold its pad tokens without the pixels).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from hyflow.agent.rollout_endpoint import HistoryRewritten, RolloutEndpoint
from hyflow.serving.app import error_body
from hyflow.serving.errors import BadRequest
from hyflow.serving.requests import chat_max_tokens, parser_tools, template_messages
from hyflow.serving.responses import Envelope, usage
from hyflow.serving.schema import ChatCompletionRequest

if TYPE_CHECKING:
    import openai


def _client_message(message: dict[str, Any]) -> dict[str, Any]:
    """The reply in OpenAI's shape (tool-call arguments as a JSON string)."""
    out = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": json.dumps(call["function"]["arguments"])}}
            for call in message["tool_calls"]
        ]
    return out


def _check_text_only(body: ChatCompletionRequest) -> None:
    for index, message in enumerate(body.messages):
        parts = message.content if isinstance(message.content, list) else []
        media = [part.type for part in parts if part.type != "text"]
        if media:
            raise BadRequest(
                f"messages[{index}] has a {media[0]} part, but the openai_agent rollout endpoint trains on text "
                "conversations only; send text content (images and videos go through the tool_agent loop)",
                "messages",
            )


def endpoint_app(endpoint: RolloutEndpoint, model_name: str = "policy") -> FastAPI:
    app = FastAPI(title="hyflow openai_agent rollout endpoint")

    @app.exception_handler(BadRequest)
    @app.exception_handler(HistoryRewritten)
    async def bad_request(_: Any, error: ValueError) -> JSONResponse:
        return JSONResponse(error_body(400, str(error)), status_code=400)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Any, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(400, f"invalid request: {error.errors()}"), status_code=400)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest) -> dict[str, Any]:
        if body.stream or body.n != 1:
            raise BadRequest("the rollout endpoint answers one choice, not streamed: send n=1 and stream=false")
        _check_text_only(body)
        reads_tools = bool(body.tools) and body.tool_choice != "none"
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if reads_tools else None
        if reads_tools:
            parser_tools(body.tools)  # a tool schema the parser cannot read is a 400 before anything is generated
        message, reason, prompt_tokens, completion_tokens = await endpoint.complete(
            template_messages(body.messages), tools, chat_max_tokens(body)
        )
        choice = {"index": 0, "message": _client_message(message), "finish_reason": reason, "logprobs": None}
        return Envelope("chat.completion", model_name).body([choice], usage(prompt_tokens, completion_tokens))

    return app


@contextlib.asynccontextmanager
async def endpoint_client(endpoint: RolloutEndpoint) -> AsyncIterator[openai.AsyncOpenAI]:
    """An AsyncOpenAI client whose requests go to this rollout's endpoint, in process."""
    import httpx
    import openai

    transport = httpx.ASGITransport(app=endpoint_app(endpoint))
    async with httpx.AsyncClient(transport=transport, base_url="http://rollout") as http:
        yield openai.AsyncOpenAI(base_url="http://rollout/v1", api_key="rollout", http_client=http, max_retries=0)
