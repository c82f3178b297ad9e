"""`hyflow serve`: an OpenAI-compatible HTTP API on the async engine (standard library only).

    hyflow serve --model PATH [--host 127.0.0.1] [--port 8000] [--max-model-len N] [--gpu-memory-utilization F]

Endpoints: `GET /v1/models`, `POST /v1/completions` (prompt: text, token ids, or a list of either),
`POST /v1/chat/completions` (messages through the tokenizer's chat template, `tools` passed to it). Every choice
carries `token_ids` (and the response `prompt_token_ids`); `"logprobs": true` (or a number) adds the log-prob of
each token. Extra sampling keys: `top_k`, `seed`, `stop_token_ids`, `ignore_eos`. No streaming.

A bad request (invalid JSON, unknown or invalid parameter, empty or too-long prompt) gets HTTP 400 with
`{"error": {"message": ...}}`; the engine keeps serving everyone else. Requests run concurrently: HTTP handler
threads submit to one asyncio loop (in its own thread) that drives the engine's step loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.sequence import RequestOutput

logger = logging.getLogger(__name__)

# OpenAI request keys -> SamplingParams keys; IGNORED keys are accepted and have no effect.
SAMPLING_KEYS = {
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "n": "n",
    "stop": "stop",
    "seed": "seed",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
}
IGNORED_KEYS = {
    "model",
    "user",
    "logprobs",
    "top_logprobs",
    "echo",
    "return_token_ids",
    "stream_options",
    "frequency_penalty",
    "presence_penalty",
    "tools",
    "tool_choice",
    "messages",
    "prompt",
}


class BadRequest(ValueError):
    """A client mistake, answered with HTTP 400."""


def sampling_from_request(body: dict[str, Any]) -> SamplingParams:
    if body.get("stream"):
        raise BadRequest("stream=true is not supported by hyflow serve; send stream=false")
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key):
            raise BadRequest(f"{key}={body[key]!r} is not supported; leave it out or set 0")
    values = {}
    for key, value in body.items():
        if key in SAMPLING_KEYS:
            values[SAMPLING_KEYS[key]] = value
        elif key not in IGNORED_KEYS and key != "stream":
            allowed = sorted(set(SAMPLING_KEYS) | IGNORED_KEYS | {"stream"})
            raise BadRequest(f"unknown parameter {key!r}; allowed: {allowed}")
    try:
        return SamplingParams(**values)
    except (TypeError, ValueError) as error:
        raise BadRequest(str(error)) from error


class EngineServer:
    """The HTTP front of one engine. `start()` serves in background threads; `serve_forever()` blocks."""

    def __init__(self, engine: LLMEngine, model_name: str, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.engine, self.model_name = engine, model_name
        self.async_engine = AsyncLLMEngine(engine)
        self.loop = asyncio.new_event_loop()
        self.httpd = ThreadingHTTPServer((host, port), _make_handler(self))
        self.httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> None:
        for target in (self.loop.run_forever, self.httpd.serve_forever):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        logger.info("hyflow serve: %s on http://%s:%d/v1", self.model_name, *self.httpd.server_address[:2])

    def serve_forever(self) -> None:
        self.start()
        try:
            self._threads[-1].join()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.loop.call_soon_threadsafe(self.loop.stop)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> RequestOutput:
        """Runs one request on the engine's loop from an HTTP thread; ValueError (bad input) -> BadRequest."""
        future = asyncio.run_coroutine_threadsafe(self.async_engine.generate(prompt_ids, params), self.loop)
        try:
            return future.result()
        except ValueError as error:
            raise BadRequest(str(error)) from error

    # ---- endpoints ------------------------------------------------------------------------------------------
    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "hyflow"}]}

    def _prompt_ids(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise BadRequest("'prompt' must be a string, a list of token ids, or a non-empty list of either")
        ids = []
        for item in prompt:
            if isinstance(item, str):
                if self.engine.tokenizer is None:
                    raise BadRequest("text prompts need a tokenizer in the model folder; send token ids instead")
                ids.append(self.engine.tokenizer.encode(item, add_special_tokens=False))
            elif isinstance(item, list) and all(isinstance(t, int) for t in item):
                ids.append(item)
            else:
                raise BadRequest(f"prompt item {item!r:.60} is neither a string nor a list of token ids")
        return ids

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        params = sampling_from_request(body)
        prompts = self._prompt_ids(body.get("prompt"))
        with_log_probs = bool(body.get("logprobs"))
        choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0}
        for prompt_ids in prompts:
            result = self.generate(prompt_ids, params)
            usage["prompt_tokens"] += len(prompt_ids)
            for out in result.outputs:
                usage["completion_tokens"] += len(out.token_ids)
                choice = {
                    "index": len(choices),
                    "text": out.text or "",
                    "finish_reason": out.finish_reason,
                    "token_ids": out.token_ids,
                    "prompt_token_ids": prompt_ids,
                    "logprobs": None,
                }
                if with_log_probs:
                    choice["logprobs"] = {"tokens": self._token_strings(out.token_ids), "token_logprobs": out.log_probs}
                choices.append(choice)
        return self._envelope("text_completion", choices, usage)

    def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        params = sampling_from_request(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list of {'role': ..., 'content': ...}")
        if self.engine.tokenizer is None:
            raise BadRequest("chat completions need a tokenizer with a chat template in the model folder")
        try:
            prompt_ids = self.engine.tokenizer.apply_chat_template(
                messages, tools=body.get("tools"), add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as error:  # a template error is the client's message shape
            raise BadRequest(f"the chat template rejected 'messages': {error}") from error
        result = self.generate(list(prompt_ids), params)
        choices = []
        for out in result.outputs:
            choice = {
                "index": out.index,
                "message": {"role": "assistant", "content": out.text or ""},
                "finish_reason": out.finish_reason,
                "token_ids": out.token_ids,
                "logprobs": None,
            }
            if body.get("logprobs"):
                tokens = self._token_strings(out.token_ids)
                choice["logprobs"] = {"content": [{"token": t, "logprob": lp} for t, lp in zip(tokens, out.log_probs)]}
            choices.append(choice)
        completion = sum(len(out.token_ids) for out in result.outputs)
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": completion}
        response = self._envelope("chat.completion", choices, usage)
        response["prompt_token_ids"] = list(prompt_ids)
        return response

    def _token_strings(self, token_ids: list[int]) -> list[str]:
        tokenizer = self.engine.tokenizer
        return [tokenizer.decode([t]) for t in token_ids] if tokenizer is not None else [str(t) for t in token_ids]

    def _envelope(self, kind: str, choices: list[dict], usage: dict[str, int]) -> dict[str, Any]:
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return {
            "id": f"hyflow-{uuid.uuid4().hex[:16]}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": usage,
        }


def _make_handler(server: EngineServer) -> type[BaseHTTPRequestHandler]:
    routes = {"/v1/completions": server.completions, "/v1/chat/completions": server.chat_completions}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s " + format, self.address_string(), *args)

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._reply(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._reply(200, server.models())
            else:
                self._error(404, f"no route GET {self.path}; try GET /v1/models")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            route = routes.get(self.path.rstrip("/"))
            if route is None:
                self._error(404, f"no route POST {self.path}; try {sorted(routes)}")
                return
            try:
                body = json.loads(raw or b"null")
                if not isinstance(body, dict):
                    raise BadRequest("the request body must be a JSON object")
                self._reply(200, route(body))
            except json.JSONDecodeError as error:
                self._error(400, f"the request body is not valid JSON: {error}")
            except BadRequest as error:
                self._error(400, str(error))
            except Exception as error:
                logger.exception("request failed")
                self._error(500, f"internal error: {error}")

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyflow serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face model folder")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None, help="the name /v1/models reports (default: --model)")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    except (OSError, ValueError):
        logger.warning("no tokenizer in %s: only token-id prompts will work", args.model)
        tokenizer = None
    config = EngineConfig(
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        dtype=args.dtype,
    )
    engine = LLMEngine(args.model, config, tokenizer)
    EngineServer(engine, args.served_model_name or args.model, args.host, args.port).serve_forever()
    return 0
