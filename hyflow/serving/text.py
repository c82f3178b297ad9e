"""The text of a sample the way OpenAI returns it: cut before the first stop string (kept with
`include_stop_str_in_output`), and, while streaming, released only once it can no longer change.

The engine stops at the token that completes a stop string and keeps that token (RL trains on it), so the text is
cut here. While streaming, the tail that could still become a stop string, and a trailing partial UTF-8 character
(decoded as U+FFFD), are held back until the next tokens decide them. The streamed text itself comes decoded from
the engine's worker thread (`AsyncLLMEngine.stream(..., detokenize=True)`); each token's own text, which log-probs
name, is decoded once per id (`TokenTexts`).
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


def cut_at_stop(text: str, stops: list[str], include_stop: bool) -> tuple[str, bool]:
    """`text` up to the earliest stop string (with it when `include_stop`), and whether one was found."""
    hits = [(text.find(stop), stop) for stop in stops if stop and stop in text]
    if not hits:
        return text, False
    index, stop = min(hits)
    return (text[: index + len(stop)] if include_stop else text[:index]), True


def stop_prefix_length(text: str, stops: list[str]) -> int:
    """The longest tail of `text` that is a proper prefix of a stop string (what a stream must hold back)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


class TokenTexts:
    """Each token id's own text, `tokenizer.decode([id])`, decoded once per id and then looked up (a streamed token's
    log-prob entry names it; decoding it anew for every token costs more than the rest of the chunk)."""

    def __init__(self, tokenizer: Any) -> None:
        self._decode = tokenizer.decode
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._decode([token_id])
        return text


class TextStream:
    """One sample's text as it grows; `delta(text, final)` returns the part that is new and settled."""

    def __init__(self, stops: list[str], include_stop: bool) -> None:
        self.stops, self.include_stop = stops, include_stop
        self.sent = ""

    def delta(self, text: str, final: bool) -> str:
        text, stopped = cut_at_stop(text, self.stops, self.include_stop)
        if not (final or stopped):
            text = text[: len(text) - stop_prefix_length(text, self.stops)].rstrip(REPLACEMENT)
        if not text.startswith(self.sent) or len(text) <= len(self.sent):
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new
