"""`hyflow serve`: the OpenAI-compatible HTTP API on hyflow's generation engine (FastAPI + uvicorn).

    hyflow serve --model PATH [--host 127.0.0.1] [--port 8000] [--tool-call-parser hermes] [--max-model-len N]
                 [--max-video-frames 32] [--max-request-pixels N] [--limit-mm-per-prompt '{"image": 4}']
                 [--mm-processor-kwargs '{"max_pixels": N}'] [--allowed-local-media-path DIR]
                 [--max-n 128] [--max-request-sequences 1024] [--max-request-tokens 4194304]
                 [--timeout-keep-alive 5] [--timeout-header 30]
                 [--preparation-threads 4]

Endpoints: POST /v1/completions, /v1/chat/completions (both with stream=true), /tokenize, /detokenize; GET
/v1/models, /v1/models/{id}, /health, /version, /metrics (Prometheus). See docs/howto/serving.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from typing import Any

from hyflow.engine.config import EngineConfig
from hyflow.serving.state import ServerLimits, ServingState

logger = logging.getLogger(__name__)


class BackgroundServer:
    """uvicorn serving an ASGI app from a daemon thread with its own event loop (the engine's step loop runs on
    it): for tests, notebooks, and an agent program's endpoint inside another process.

        with BackgroundServer(build_app(state)) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="none")
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, timeout_keep_alive: int = 5, timeout_header: float = 30
    ) -> None:
        import uvicorn

        config = uvicorn.Config(
            app, host=host, port=port, lifespan="off", **uvicorn_options(timeout_keep_alive, timeout_header)
        )
        self.server = uvicorn.Server(config)
        self.host, self.port = host, port
        self._thread = threading.Thread(target=self.server.run, daemon=True, name="hyflow-serve")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 60.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"hyflow serve did not start on {self.host}:{self.port} (is the port taken?)")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]  # the one picked for port 0
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def uvicorn_options(timeout_keep_alive: int, timeout_header: float) -> dict[str, Any]:
    """uvicorn's settings for `hyflow serve`: an idle keep-alive connection is closed after `timeout_keep_alive`
    seconds, one whose request headers are not complete after `timeout_header` seconds (connections.py)."""
    from hyflow.serving.connections import header_deadline_protocol

    return {
        "log_level": "warning",
        "backlog": 4096,
        "timeout_keep_alive": timeout_keep_alive,
        "http": header_deadline_protocol(timeout_header),
    }


def build_state(args: argparse.Namespace) -> ServingState:
    """The engine, tokenizer and tool parser of the command line's model."""
    from transformers import AutoTokenizer

    from hyflow.agent.parsers import ToolParser
    from hyflow.engine.engine import LLMEngine
    from hyflow.models.processor import load_processor

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    except (OSError, ValueError) as error:
        raise SystemExit(f"hyflow serve: no tokenizer could be loaded from --model {args.model}: {error}") from error
    config = EngineConfig(
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        dtype=args.dtype,
    )
    engine = LLMEngine(args.model, config, tokenizer)
    parser = ToolParser.get(args.tool_call_parser, tokenizer) if args.tool_call_parser else None
    media_root = args.allowed_local_media_path
    if media_root is not None and not os.path.isdir(media_root):
        raise SystemExit(f"hyflow serve: --allowed-local-media-path {media_root} is not a directory")
    limits = ServerLimits(
        request_timeout=args.request_timeout,
        max_request_bytes=args.max_request_bytes,
        max_video_frames=args.max_video_frames,
        allowed_local_media_path=args.allowed_local_media_path,
        max_request_pixels=args.max_request_pixels,
        limit_mm_per_prompt=args.limit_mm_per_prompt,
        max_n=args.max_n,
        max_request_sequences=args.max_request_sequences,
        max_request_tokens=args.max_request_tokens,
        preparation_threads=args.preparation_threads,
    )
    processor = load_processor(args.model, **args.mm_processor_kwargs)  # None for a text model
    return ServingState(engine, args.served_model_name or args.model, parser, limits, processor=processor)


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a count of 1 or more")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds above 0")
    return value


def _mm_limits(text: str) -> dict[str, int]:
    from hyflow.serving.media_budget import parse_limit_mm_per_prompt

    try:
        return parse_limit_mm_per_prompt(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _processor_kwargs(text: str) -> dict[str, int]:
    """`--mm-processor-kwargs` (vLLM's flag) as far as hyflow reads it: the image processor's `min_pixels` /
    `max_pixels` (pixels per picture after its resize; the trainer's `data.min_pixels` / `data.max_pixels`)."""
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as error:
        example = "'{\"max_pixels\": 1003520}'"
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({error}); give e.g. {example}") from None
    sizes = ("min_pixels", "max_pixels")
    valid = isinstance(kwargs, dict) and all(
        key in sizes and isinstance(value, int) and not isinstance(value, bool) and value > 0
        for key, value in kwargs.items()
    )
    if not valid:
        raise argparse.ArgumentTypeError(
            f"{text!r}: hyflow serve reads {' and '.join(sizes)} only, each a pixel count above 0 (as the trainer's "
            "data.min_pixels / data.max_pixels), e.g. '{\"max_pixels\": 1003520}'"
        )
    return kwargs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from hyflow.agent.parsers import ToolParser

    parser = argparse.ArgumentParser(prog="hyflow serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face model folder (with its tokenizer)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None, help="the name /v1/models reports (default: --model)")
    parser.add_argument(
        "--tool-call-parser", default=None, choices=ToolParser.names(), help="read tool calls in chat replies"
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds before a request is aborted")
    parser.add_argument("--max-request-bytes", type=int, default=4 * 2**20, help="largest request body accepted")
    parser.add_argument("--max-video-frames", type=int, default=32, help="most frames of one video part")
    parser.add_argument(
        "--max-request-pixels",
        type=_count,
        default=ServerLimits.max_request_pixels,
        help="most pixels one request's images and video frames may decode to, together (checked before decoding)",
    )
    parser.add_argument(
        "--limit-mm-per-prompt",
        type=_mm_limits,
        default={},
        help='most image / video parts per request, as JSON: \'{"image": 4, "video": 1}\' (default: no count limit)',
    )
    parser.add_argument(
        "--mm-processor-kwargs",
        type=_processor_kwargs,
        default={},
        help='the image processor\'s pixels per picture, as JSON: \'{"min_pixels": 3136, "max_pixels": 1003520}\'',
    )
    parser.add_argument(
        "--allowed-local-media-path", default=None, help="a directory whose files image and video parts may name"
    )
    _add_request_limits(parser)
    parser.add_argument(
        "--preparation-threads",
        type=_count,
        default=ServerLimits.preparation_threads,
        help="threads that render chat templates, tokenize and decode media, off the event loop",
    )
    return parser.parse_args(argv)


def _add_request_limits(parser: argparse.ArgumentParser) -> None:
    """What one request may ask the engine for, and how long a connection may stay silent."""
    limits = ServerLimits()
    parser.add_argument(
        "--max-n",
        type=_count,
        default=limits.max_n,
        help="most samples per prompt (n, best_of) of one request (default: %(default)s)",
    )
    parser.add_argument(
        "--max-request-sequences",
        type=_count,
        default=limits.max_request_sequences,
        help="most sequences one request makes (prompts × n) (default: %(default)s)",
    )
    parser.add_argument(
        "--max-request-tokens",
        type=_count,
        default=limits.max_request_tokens,
        help="most tokens one request may generate (n × max_tokens, summed over prompts; default: %(default)s)",
    )
    parser.add_argument(
        "--timeout-keep-alive",
        type=_count,
        default=5,
        help="seconds an idle keep-alive connection is kept open (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout-header",
        type=_seconds,
        default=30.0,
        help="seconds a connection may take to send a request's headers before it is closed (default: %(default)s)",
    )


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from hyflow.serving.app import build_app

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_app(build_state(args))
    logger.info("hyflow serve: %s on http://%s:%d/v1", args.served_model_name or args.model, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, **uvicorn_options(args.timeout_keep_alive, args.timeout_header))
    return 0
