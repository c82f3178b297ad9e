"""A sample's text while it is generated, decoding only its newest tokens at each step.

    detokenizer = IncrementalDetokenizer(tokenizer)
    text = detokenizer.update(token_ids)      # all of the sample's ids so far -> all of its text so far

Decoding the whole sample after every step costs O(length) per step, O(length²) per stream. Instead two offsets
into the ids are kept (as in vLLM's incremental detokenisation): `read` (the tokens whose text is settled) and
`prefix`, a few tokens before it that give the decoder its context (a leading space, a byte-level merge).
The new text of a step is

    decode(ids[prefix:]) minus its first len(decode(ids[prefix:read])) characters

taken only once it does not end in U+FFFD (a multi-byte character whose last bytes are still to come); until then
the tokens wait, and the offsets stay. Special tokens are skipped, as in the engine's final text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["IncrementalDetokenizer"]

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """The text of one growing sequence of token ids; `update(ids)` takes all ids so far (a longer list each call)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._decode = tokenizer.decode
        self.skip_special_tokens = skip_special_tokens
        self.text = ""
        self.prefix = 0  # ids[prefix:read] is the context the newest tokens are decoded after
        self.read = 0

    def update(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids` (which extend the ids of the call before)."""
        if len(token_ids) <= self.read:
            return self.text
        skip = self.skip_special_tokens
        settled = self._decode(token_ids[self.prefix : self.read], skip_special_tokens=skip) if self.read else ""
        grown = self._decode(token_ids[self.prefix :], skip_special_tokens=skip)
        if len(grown) > len(settled) and not grown.endswith(REPLACEMENT):
            self.text += grown[len(settled) :]
            self.prefix, self.read = self.read, len(token_ids)
        return self.text
