"""Request preparation runs off the event loop: while one request's prompt is being rendered and tokenized, the
server answers its other clients; and a text that cannot fit the context is refused before it is tokenized."""

from __future__ import annotations

import threading

import httpx
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hyflow.models.tiny import build_tiny_tokenizer
from hyflow.serving.preparation import max_bytes_per_token
from hyflow.serving.server import parse_args

from .conftest import MAX_MODEL_LEN, MODEL

MARK = "prepare-me-slowly"


def ask(server, endpoint: str, text: str) -> httpx.Response:
    if endpoint == "tokenize":
        return httpx.post(f"http://{server.host}:{server.port}/tokenize", json={"prompt": text}, timeout=120)
    body = {"model": MODEL, "max_tokens": 2, "temperature": 0}
    if endpoint == "chat/completions":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return httpx.post(f"{server.base_url}/{endpoint}", json=body, timeout=120)


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions", "tokenize"])
def test_health_answers_while_a_prompt_is_being_tokenized(server, state, endpoint, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    encode = state.tokenizer.encode

    def held_encode(text, *args, **kwargs):
        if MARK in text:  # this request's prompt: tokenizing it takes until the test releases it
            entered.set()
            release.wait(timeout=120)
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(state.tokenizer, "encode", held_encode)
    replies: list[httpx.Response] = []
    asking = threading.Thread(target=lambda: replies.append(ask(server, endpoint, f"{MARK}: hello")))
    asking.start()
    try:
        assert entered.wait(timeout=120), "the request never reached its tokenizer"
        health = httpx.get(f"http://{server.host}:{server.port}/health", timeout=60)
        assert health.json() == {"status": "ok"}
        assert replies == [] and not release.is_set()  # answered while the prompt was still being tokenized
    finally:
        release.set()
        asking.join(timeout=120)
    assert replies[0].status_code == 200


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_a_text_longer_than_the_context_can_hold_is_refused_without_being_tokenized(
    server, state, endpoint, monkeypatch
):
    bound = state.preparer.bytes_per_token
    assert bound is not None  # the tiny byte-level BPE drops no text
    seen: list[int] = []
    encode = state.tokenizer.encode

    def recording_encode(text, *args, **kwargs):
        seen.append(len(text))
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(state.tokenizer, "encode", recording_encode)
    text = "x" * (MAX_MODEL_LEN * bound + 1)
    reply = ask(server, endpoint, text)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["message"]
    assert f"at least one token of every {bound} bytes" in error["message"]
    assert error["param"] == ("messages" if endpoint == "chat/completions" else "prompt")
    assert all(length < len(text) for length in seen)  # the long text never reached the tokenizer


def test_the_bytes_per_token_bound_holds_for_the_tiny_tokenizer_on_any_text():
    tokenizer = build_tiny_tokenizer()
    bound = max_bytes_per_token(tokenizer)
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    assert bound == max(16, *(len(token) for token in vocab))
    texts = ["1234567890" * 50, " " * 4000, "the the the " * 300, "日本語のテキスト🙂" * 40, "<|im_start|>" * 30]
    for text in texts:
        num_tokens = len(tokenizer.encode(text, add_special_tokens=False))
        assert len(text.encode()) <= num_tokens * bound


def _word_tokenizer(pre_tokenizer, normalizer=None) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "<unk>": 2}, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        backend.normalizer = normalizer
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_a_tokenizer_that_may_drop_text_gets_no_bound_and_a_normalizer_widens_it():
    assert max_bytes_per_token(_word_tokenizer(pre_tokenizers.WhitespaceSplit())) is None  # spaces vanish
    assert max_bytes_per_token(_word_tokenizer(pre_tokenizers.Digits())) == 5  # "<unk>" per unknown character
    widened = _word_tokenizer(pre_tokenizers.Digits(), normalizers.NFKC())
    assert max_bytes_per_token(widened) == 20  # NFKC makes "𝐚" (4 bytes) an "a" (1 byte)
    assert max_bytes_per_token(_word_tokenizer(pre_tokenizers.Digits(), normalizers.Strip())) is None


def test_preparation_threads_is_a_serve_flag():
    assert parse_args(["--model", "m", "--preparation-threads", "8"]).preparation_threads == 8
    assert parse_args(["--model", "m"]).preparation_threads == 4
