"""Request preparation off the event loop: chat-template rendering, tokenization and image/video decoding run in a
bounded pool of threads (`--preparation-threads`), so a large prompt or picture never stalls `/health`, the other
clients' streams or the engine's step loop; and a text that cannot fit the context is refused before it is
tokenized.

    prepared = await state.preparer.run(_prepare, state, request)   # in a pool thread; BadRequest passes through
    state.preparer.check_fits(text, "messages")                      # in that thread, before tokenizer.encode(text)

The tokenizers library and Pillow's decoders release the GIL while they work, so the pool's threads work beside the
event loop rather than taking turns with it. At most `--preparation-threads` requests are prepared at once; the
others wait in the pool's queue (a request whose client leaves while it waits is never prepared).

The bound: a tokenizer whose steps drop no text makes at least one token of every `bytes_per_token` bytes, so a
text of more than `max_model_len · bytes_per_token` UTF-8 bytes has more tokens than the context holds, and is a 400
before any of it is tokenized. `bytes_per_token` (`max_bytes_per_token`) is the longest token's length in bytes (a
byte-level vocabulary's character stands for one byte, any other's for its UTF-8 bytes; an added token's content
counts as written) times what the normalizer may shrink the text by: 1 without one (or with `Prepend` / a `Replace`
of one string by one no shorter), 4 for each Unicode normalization or lowercasing step (a character of at most 4
UTF-8 bytes becomes at least one). A tokenizer with a step that may drop text (a pre-tokenizer that removes
whitespace or a pattern, a model that fuses unknown characters into one token or skips them, an added token that
absorbs the whitespace beside it, a normalizer of another kind) has no such bound: its texts are tokenized in full
and then checked, as before.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from hyflow.serving.errors import BadRequest

T = TypeVar("T")

UNICODE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"}
KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Digits", "Metaspace", "UnicodeScripts", "Split", "Punctuation"}
MAX_UTF8_CHAR_BYTES = 4


def _normalizer_factor(spec: dict[str, Any] | None) -> int | None:
    """How many bytes of input one byte of the normalized text may stand for (None: unbounded)."""
    if spec is None or spec["type"] == "Prepend":
        return 1
    if spec["type"] == "Sequence":
        factor = 1
        for step in spec["normalizers"]:
            step_factor = _normalizer_factor(step)
            if step_factor is None:
                return None
            factor *= step_factor
        return factor
    if spec["type"] in UNICODE_NORMALIZERS:
        return MAX_UTF8_CHAR_BYTES
    if spec["type"] == "Replace" and "String" in spec["pattern"]:
        shrinks = len(spec["content"].encode()) < len(spec["pattern"]["String"].encode())
        return None if shrinks else 1
    return None


def _keeps_text(spec: dict[str, Any] | None) -> bool:
    """Whether a pre-tokenizer only splits text (and never removes any of it)."""
    if spec is None:
        return True
    if spec["type"] == "Sequence":
        return all(_keeps_text(step) for step in spec["pretokenizers"])
    return spec["type"] in KEEPING_PRE_TOKENIZERS and spec.get("behavior") != "Removed"


def _is_byte_level(spec: dict[str, Any] | None) -> bool:
    if spec is None:
        return False
    if spec["type"] == "Sequence":
        return any(_is_byte_level(step) for step in spec["pretokenizers"])
    return spec["type"] == "ByteLevel"


def _model_keeps_text(model: dict[str, Any], byte_level: bool) -> bool:
    """Whether the model turns every character into tokens of its own (a byte-level alphabet, byte fallback, or one
    unknown token per unknown character)."""
    if model["type"] not in ("BPE", "Unigram"):
        return False  # WordPiece and WordLevel make one unknown token of a whole word
    if byte_level or model.get("byte_fallback"):
        return True
    return model["type"] == "BPE" and model.get("unk_token") is not None and not model.get("fuse_unk")


def max_bytes_per_token(tokenizer: Any) -> int | None:
    """The most UTF-8 bytes of text one token of `tokenizer` may stand for (the module docstring gives the rule), or
    None when its steps may drop text, or it is not a fast (tokenizers) tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    factor = _normalizer_factor(spec.get("normalizer"))
    byte_level = _is_byte_level(spec.get("pre_tokenizer"))
    added = spec.get("added_tokens") or []
    if factor is None or not _keeps_text(spec.get("pre_tokenizer")) or not _model_keeps_text(spec["model"], byte_level):
        return None
    if any(token.get("lstrip") or token.get("rstrip") for token in added):
        return None
    vocab = backend.get_vocab(with_added_tokens=False)
    longest = max((len(token) if byte_level else len(token.encode()) for token in vocab), default=1)
    longest = max([longest, MAX_UTF8_CHAR_BYTES, *(len(token["content"].encode()) for token in added)])
    return longest * factor


class Preparer:
    """The pool of threads requests are prepared in, and the tokenizer's bytes-per-token bound."""

    def __init__(self, tokenizer: Any, max_model_len: int, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"preparation_threads={threads}: give 1 or more threads (--preparation-threads)")
        self.max_model_len = max_model_len
        self.bytes_per_token = max_bytes_per_token(tokenizer)
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="hyflow-prepare")

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`function(*args, **kwargs)` in a pool thread; its exceptions (a BadRequest too) are raised here."""
        call = functools.partial(function, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    def check_fits(self, text: str, param: str) -> None:
        """A 400 naming the context length when `text` has more bytes than `max_model_len` tokens can stand for
        (checked before `text` is tokenized; no check for a tokenizer without a bound)."""
        if self.bytes_per_token is None:
            return
        limit = self.max_model_len * self.bytes_per_token
        size = len(text.encode("utf-8", errors="surrogatepass"))
        if size > limit:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens, but the prompt is {size:,} "
                f"bytes of text, and this tokenizer makes at least one token of every {self.bytes_per_token} bytes, "
                f"so it cannot fit (at most {limit:,} bytes can). Shorten the prompt.",
                param,
            )
