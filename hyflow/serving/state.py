"""What the server's routes share: the engine, the tokenizer, the served name, the limits and the metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hyflow.agent.parsers import ToolParser
from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.engine import LLMEngine
from hyflow.serving.metrics import ServerMetrics
from hyflow.serving.preparation import Preparer
from hyflow.serving.text import TokenTexts


def keep_pillow_bound_above(max_request_pixels: int) -> None:
    """Pillow refuses a picture over 2 · `Image.MAX_IMAGE_PIXELS` before the server can look at it; keep that above
    the server's own budget, so that its refusal always means "over --max-request-pixels" (media_budget.py). The bound
    is only ever raised, never lowered or switched off (None), so Pillow's bomb check stays in force."""
    from PIL import Image

    if Image.MAX_IMAGE_PIXELS is not None and max_request_pixels > Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = max_request_pixels


@dataclass
class ServerLimits:
    """`request_timeout`: seconds a request may run before it is aborted (HTTP 408, or an error event in a stream);
    `max_request_bytes`: the largest request body accepted (HTTP 413 above); `max_video_frames`: the most frames
    one video part may have (HTTP 400 above; vLLM samples 32 frames of a video by default);
    `allowed_local_media_path`: the directory whose files image and video parts may name as `file://` URLs (None:
    inline data only); `max_request_pixels`: the most pixels one request's images and video frames may decode to,
    together (HTTP 400 above, from the files' headers, before decoding: media_budget.py; the default takes 32
    full-HD frames or eight 4K images); `limit_mm_per_prompt`: the most parts of a modality ("image", "video") one
    request may have (vLLM's `--limit-mm-per-prompt`; a modality not named has no count limit). What one request
    may ask the engine for (HTTP 400 above, before any sequence is built: requests.py): `max_n` samples per prompt
    (`n`, `best_of`; OpenAI's own cap is 128), `max_request_sequences` sequences (prompts × n), and
    `max_request_tokens` generated tokens (n × each prompt's `max_tokens`, summed);
    `preparation_threads`: the threads requests are prepared in, off the event loop (template, tokenizer, image and
    video decoding: preparation.py)."""

    request_timeout: float = 600.0
    max_request_bytes: int = 4 * 2**20
    max_video_frames: int = 32
    allowed_local_media_path: str | None = None
    max_request_pixels: int = 2**26
    limit_mm_per_prompt: dict[str, int] = field(default_factory=dict)
    max_n: int = 128
    max_request_sequences: int = 1024
    max_request_tokens: int = 2**22
    preparation_threads: int = 4


@dataclass
class ServingState:
    engine: LLMEngine
    model_name: str
    tool_parser: ToolParser | None = None
    limits: ServerLimits = field(default_factory=ServerLimits)
    processor: Any = None  # a vision-language model's processor (image and video parts of chat messages, media.py)
    created: int = field(default_factory=lambda: int(time.time()))
    async_engine: AsyncLLMEngine = field(init=False)
    metrics: ServerMetrics = field(init=False)
    token_text: TokenTexts = field(init=False)  # a token id's own text, decoded once per id
    preparer: Preparer = field(init=False)  # the threads requests are prepared in (preparation.py)

    def __post_init__(self) -> None:
        if self.engine.tokenizer is None:
            raise ValueError(
                "hyflow serve needs the model's tokenizer; pass one to LLMEngine(model, config, tokenizer)"
            )
        keep_pillow_bound_above(self.limits.max_request_pixels)
        self.async_engine = AsyncLLMEngine(self.engine)
        self.metrics = ServerMetrics(self.engine)
        self.token_text = TokenTexts(self.engine.tokenizer)
        self.preparer = Preparer(self.engine.tokenizer, self.max_model_len, self.limits.preparation_threads)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.engine.model.args.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.engine.config.max_model_len
