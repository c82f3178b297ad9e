"""A running `hyflow serve` answers what a client gets wrong with an OpenAI-shaped 4xx that names the field, the
limit and the fix, never a bare 500: request limits (`--max-n`, `--max-request-sequences`, `--max-request-tokens`),
token ids outside the vocabulary, lone surrogates, bodies that are not UTF-8, too deep or too large, loosely typed
values and non-object tool schemas. A 500 that does happen is counted in /metrics."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hyflow.serving import ServerLimits
from hyflow.serving.server import build_state, parse_args

from .conftest import MODEL

ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.base_url.removesuffix("/v1"), timeout=60) as client:
        yield client


@pytest.fixture
def no_engine(state, monkeypatch):
    """The engine fails the test if a request reaches it."""

    async def refuse(*args, **kwargs):
        raise AssertionError("the request reached the engine")

    monkeypatch.setattr(state.async_engine, "generate", refuse)


def post_json(http: httpx.Client, path: str, body: str | bytes) -> httpx.Response:
    return http.post(path, content=body, headers={"content-type": "application/json"})


def error_of(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize(
    "limit, value, request_",
    [
        ("max_n", 4, {"prompt": "hi", "n": 5}),
        ("max_n", 4, {"prompt": "hi", "n": 4, "best_of": 5}),
        ("max_request_sequences", 5, {"prompt": ["a", "b", "c"], "n": 2}),
        ("max_request_tokens", 10, {"prompt": ["a", "b"], "n": 1, "max_tokens": 6}),
    ],
)
def test_a_completion_past_a_request_limit_is_a_400_naming_the_flag_before_the_engine_sees_it(
    client, state, monkeypatch, no_engine, limit, value, request_
):
    monkeypatch.setattr(state.limits, limit, value)
    flag = "--" + limit.replace("_", "-")
    with pytest.raises(openai.BadRequestError, match=f"limit of {value} .*{flag}"):
        client.completions.create(model=MODEL, **{"max_tokens": 1, **request_})


def test_a_chat_whose_unset_max_tokens_takes_the_context_past_the_token_budget_is_a_400(
    client, state, monkeypatch, no_engine
):
    monkeypatch.setattr(state.limits, "max_request_tokens", 1000)
    with pytest.raises(openai.BadRequestError, match="--max-request-tokens") as error:
        client.chat.completions.create(model=MODEL, messages=ASK, n=2)
    assert error.value.body["param"] == "max_tokens"


@pytest.mark.parametrize("prompt", [[-1], [2**70], [[5, 6], [7, 10**6]]])
def test_token_ids_outside_the_vocabulary_are_a_400_naming_the_prompt(http, state, prompt):
    response = post_json(http, "/v1/completions", json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}))
    error = error_of(response)
    assert error["param"] == "prompt" and f"outside the vocabulary [0, {state.vocab_size})" in error["message"]


LONE = '"a\\ud800b"'  # JSON for a string with a lone surrogate


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/v1/completions", f'{{"model": "{MODEL}", "prompt": {LONE}}}', "prompt"),
        ("/v1/completions", f'{{"model": "{MODEL}", "prompt": ["ok", {LONE}]}}', "prompt[1]"),
        ("/v1/chat/completions", f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": {LONE}}}]}}',
         "messages[0].content"),
        ("/tokenize", f'{{"prompt": {LONE}}}', "prompt"),
        (
            "/v1/chat/completions",
            f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}], '
            f'"tools": [{{"type": "function", "function": {{"name": {LONE}}}}}]}}',
            "tools[0].function.name",
        ),
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_a_400_naming_its_field(http, path, body, field):
    error = error_of(post_json(http, path, body))
    assert error["param"] == field and "lone surrogate" in error["message"] and field in error["message"]


def http_requests(http: httpx.Client, endpoint: str, status: str) -> float:
    families = text_string_to_metric_families(http.get("/metrics").text)
    samples = next(family for family in families if family.name == "hyflow_http_requests").samples
    found = [s.value for s in samples if s.labels == {"endpoint": endpoint, "status": status}]
    return found[0] if found else 0.0


def test_an_internal_error_is_an_openai_shaped_500_counted_in_metrics(http, state, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the server")

    before = http_requests(http, "/tokenize", "500")
    monkeypatch.setattr(state.tokenizer, "encode", broken)
    error = error_of(post_json(http, "/tokenize", json.dumps({"prompt": "hi"})), status=500)
    assert error["code"] == 500 and "RuntimeError" in error["message"]
    assert http_requests(http, "/tokenize", "500") == before + 1


def test_a_chunked_body_over_the_limit_is_a_413(http, state):
    def chunks():
        yield b'{"model": "tiny-chat", "prompt": "'
        for _ in range(state.limits.max_request_bytes // 2**16 + 1):
            yield b"x" * 2**16
        yield b'"}'

    error = error_of(http.post("/v1/completions", content=chunks()), status=413)
    assert "--max-request-bytes" in error["message"]


def test_a_body_that_is_not_utf8_is_a_400_saying_so(http):
    body = f'{{"model": "{MODEL}", "prompt": "caf'.encode() + b'\xe9"}'  # Latin-1, not UTF-8
    error = error_of(post_json(http, "/v1/completions", body))
    assert "not valid UTF-8 (byte 0xe9 at offset" in error["message"]


@pytest.mark.parametrize("depth", [150, 1000])
def test_json_nested_hundreds_deep_is_a_400_saying_so(http, depth):
    body = f'{{"model": "{MODEL}", "prompt": ' + "[" * depth + "]" * depth + "}"
    error = error_of(post_json(http, "/v1/completions", body))
    assert "nests deeper than 100 levels" in error["message"]


def test_a_body_that_is_not_json_is_a_400_saying_where(http):
    error = error_of(post_json(http, "/v1/completions", '{"model": "tiny-chat", "prompt": }'))
    assert error["message"].startswith("the request body is not JSON (Expecting value at character 33")


@pytest.mark.parametrize(
    "key, value", [("stream", "yes"), ("n", "2"), ("ignore_eos", 1), ("max_tokens", 2.0), ("top_k", 2**70)]
)
def test_a_value_of_the_wrong_json_type_or_past_its_range_is_refused_by_name_not_coerced(http, key, value):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2, key: value}
    error = error_of(post_json(http, "/v1/chat/completions", json.dumps(body)))
    assert error["message"].startswith(f"invalid request: {key}: ") and repr(value) in error["message"]


def test_tool_parameters_that_are_not_an_object_schema_are_a_400_naming_the_tool(client):
    tool = {"type": "function", "function": {"name": "listing", "parameters": {"type": "array"}}}
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]\.function\.parameters of 'listing' has type 'array'"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[tool], max_tokens=2)


def test_the_serve_command_line_sets_the_request_limits(model_path):
    flags = ["--max-n", "4", "--max-request-sequences", "8", "--max-request-tokens", "99"]
    limits = build_state(parse_args(["--model", model_path, *flags])).limits
    assert (limits.max_n, limits.max_request_sequences, limits.max_request_tokens) == (4, 8, 99)
    defaults = parse_args(["--model", model_path])
    assert (defaults.max_n, defaults.max_request_tokens) == (ServerLimits.max_n, ServerLimits.max_request_tokens)
