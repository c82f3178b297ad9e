"""IncrementalDetokenizer: a growing sample's text from its newest tokens, always a prefix of the full decode."""

from __future__ import annotations

import pytest

from hyflow.engine.detokenizer import REPLACEMENT, IncrementalDetokenizer
from hyflow.models.tiny import build_tiny_tokenizer

TEXT = 'Hello, wörld! 3+4=7 café 你好世界 <tool_call>{"a": 1}</tool_call>  two  spaces\n\nend'


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def full(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("step", [1, 2, 3])
def test_the_text_grows_as_a_prefix_of_the_full_decode_and_ends_equal_to_it(tokenizer, step):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer)
    for end in range(step, len(ids) + step, step):
        text = detokenizer.update(ids[:end])
        assert full(tokenizer, ids[:end]).startswith(text)
        assert REPLACEMENT not in text
    assert text == full(tokenizer, ids) == TEXT


def test_a_character_split_over_tokens_is_held_back_until_its_last_byte(tokenizer):
    ids = tokenizer.encode("a 你", add_special_tokens=False)
    cut = next(end for end in range(1, len(ids)) if full(tokenizer, ids[:end]).endswith(REPLACEMENT))
    detokenizer = IncrementalDetokenizer(tokenizer)
    for end in range(1, cut + 1):  # one token at a time, the last one a character's first bytes
        text = detokenizer.update(ids[:end])
    assert text == full(tokenizer, ids[:cut]).rstrip(REPLACEMENT) == "a "
    assert detokenizer.update(ids) == "a 你"


def test_special_tokens_are_skipped_as_in_the_engines_final_text(tokenizer):
    ids = tokenizer.encode("<|im_start|>hi<|im_end|>", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer)
    for end in range(1, len(ids) + 1):
        text = detokenizer.update(ids[:end])
    assert text == "hi" == full(tokenizer, ids)
