"""`hyflow serve` through the official `openai` client: every response is validated against the client's own
pydantic types (the client parses them; `model_validate` of the raw JSON checks the streamed and extra shapes)."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from hyflow.engine.config import SamplingParams

from .conftest import MAX_MODEL_LEN, MODEL

PROMPT = "The quick brown fox"
GREEDY = {"temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}


def validate_completion_chunk(chunk: dict) -> None:
    """The client has no chunk type for completions (it reads them, unvalidated, as `Completion`, whose
    finish_reason may not be None): everything but a still-open finish_reason must match."""
    for choice in chunk["choices"]:
        choice["finish_reason"] = choice["finish_reason"] or "length"
    Completion.model_validate(chunk)


def test_models_list_and_retrieve_report_the_served_model_with_its_creation_time(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL] and models[0].created > 0
    assert Model.model_validate(client.models.retrieve(MODEL).model_dump()).id == MODEL
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4")


def test_an_unknown_model_in_a_request_is_a_404(client):
    with pytest.raises(openai.NotFoundError, match="'gpt-4' does not exist"):
        client.completions.create(model="gpt-4", prompt=PROMPT)


def test_a_greedy_completion_equals_the_engines_solo_run_and_carries_token_ids_when_asked(client, state):
    extra = {"ignore_eos": True, "return_token_ids": True}
    response = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=12, extra_body=extra)
    Completion.model_validate(response.model_dump())
    choice = response.choices[0].model_dump()
    prompt_ids = state.tokenizer.encode(PROMPT, add_special_tokens=False)
    solo = state.engine.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert choice["token_ids"] == solo[0].outputs[0].token_ids and choice["prompt_token_ids"] == prompt_ids
    assert choice["text"] == solo[0].outputs[0].text and choice["finish_reason"] == "length"
    assert response.usage.completion_tokens == 12 and response.usage.prompt_tokens == len(prompt_ids)


def test_a_streamed_completion_adds_up_to_the_whole_one_with_usage_last(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, n=2, seed=3, max_tokens=20)
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, n=2, seed=3, max_tokens=20, stream=True, stream_options={"include_usage": True}
        )
    )
    for chunk in chunks:
        validate_completion_chunk(chunk.model_dump())
    texts = {0: "", 1: ""}
    reasons = {}
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason is not None:
                reasons[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_chat_content_given_as_parts_reads_as_the_same_text(client):
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi there"}], **GREEDY)
    parts = [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]
    joined = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi\nthere"}], **GREEDY)
    from_parts = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}], **GREEDY)
    ChatCompletion.model_validate(from_parts.model_dump())
    assert from_parts.choices[0].message.content == joined.choices[0].message.content
    assert plain.choices[0].message.role == "assistant"


def test_a_streamed_chat_adds_up_to_the_whole_one(client):
    messages = [{"role": "user", "content": "count with me"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, seed=1, max_tokens=24)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, seed=1, max_tokens=24, stream=True, stream_options={"include_usage": True}
    )
    chunks = [ChatCompletionChunk.model_validate(chunk.model_dump()) for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_strings_are_cut_from_the_text_unless_asked_to_keep_them(client):
    free = client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY).choices[0].text
    stop = free[4:7]
    assert len(stop.strip()) > 0 and stop in free
    cut = client.completions.create(model=MODEL, prompt=PROMPT, stop=[stop], **GREEDY).choices[0]
    assert cut.text == free[: free.index(stop)] and cut.finish_reason == "stop"
    keep = dict(GREEDY, extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    kept = client.completions.create(model=MODEL, prompt=PROMPT, stop=[stop], **keep).choices[0].text
    assert kept == free[: free.index(stop) + len(stop)]
    streamed = client.completions.create(model=MODEL, prompt=PROMPT, stop=[stop], stream=True, **GREEDY)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == cut.text


def test_chat_logprobs_carry_the_engines_top_alternatives(client):
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], logprobs=True, top_logprobs=3, **GREEDY
    )
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens == 12
    for entry in content:
        assert len(entry.top_logprobs) == 3
        values = [alt.logprob for alt in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob


def test_completion_logprobs_and_echo(client):
    response = client.completions.create(model=MODEL, prompt=PROMPT, logprobs=2, **GREEDY)
    log_probs = response.choices[0].logprobs
    assert len(log_probs.tokens) == len(log_probs.token_logprobs) == len(log_probs.top_logprobs) == 12
    assert all(len(alternatives) <= 2 for alternatives in log_probs.top_logprobs)
    assert "".join(log_probs.tokens) == response.choices[0].text
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, echo=True, **GREEDY).choices[0].text
    assert echoed == PROMPT + response.choices[0].text
    with pytest.raises(openai.BadRequestError, match="echo=true with logprobs"):
        client.completions.create(model=MODEL, prompt=PROMPT, echo=True, logprobs=1, max_tokens=2)


def test_max_tokens_past_the_context_is_a_400_naming_the_limit(client):
    with pytest.raises(openai.BadRequestError, match=f"maximum context length is {MAX_MODEL_LEN} tokens"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_MODEL_LEN)


@pytest.mark.parametrize(
    "key, value",
    [
        ("presence_penalty", 0.5),
        ("frequency_penalty", 1.0),
        ("repetition_penalty", 1.2),
        ("min_p", 0.1),
        ("min_tokens", 3),
        ("logit_bias", {"5": 10}),
    ],
)
def test_sampling_keys_the_engine_does_not_implement_are_refused_by_name(client, key, value):
    with pytest.raises(openai.BadRequestError, match=f"{key}.* not supported"):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2, extra_body={key: value}
        )


def test_an_unknown_key_is_refused_by_name(client):
    with pytest.raises(openai.BadRequestError, match="temprature"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"temprature": 0})


def test_health_version_tokenize_detokenize_and_metrics(server, client):
    base = server.base_url.removesuffix("/v1")
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3)
    with httpx.Client(base_url=base) as http:
        assert http.get("/health").json() == {"status": "ok"}
        assert http.get("/version").json()["version"]
        tokens = http.post("/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()
        assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == MAX_MODEL_LEN
        assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": PROMPT}
        metrics = http.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    families = {family.name: family for family in text_string_to_metric_families(metrics.text)}
    names = set(families)
    generated = {sample.name: sample.value for sample in families["hyflow_generation_tokens"].samples}
    assert generated["hyflow_generation_tokens_total"] >= 3  # the completion above
    latency = {sample.name: sample.value for sample in families["hyflow_e2e_request_latency_seconds"].samples}
    assert latency["hyflow_e2e_request_latency_seconds_count"] >= 1
    expected = {
        "hyflow_requests_running",
        "hyflow_requests_waiting",
        "hyflow_kv_cache_usage_ratio",
        "hyflow_generation_tokens",
        "hyflow_generation_tokens_per_second",
        "hyflow_time_to_first_token_seconds",
        "hyflow_e2e_request_latency_seconds",
        "hyflow_http_requests",
    }
    assert expected <= names


def test_a_body_over_the_limit_is_a_413(server, state):
    with httpx.Client(base_url=server.base_url) as http:
        big = "x" * (state.limits.max_request_bytes + 1)
        response = http.post("/completions", json={"model": MODEL, "prompt": big})
    assert response.status_code == 413 and "--max-request-bytes" in response.json()["error"]["message"]


def test_a_request_past_the_timeout_is_aborted_with_a_408(client, state, monkeypatch):
    monkeypatch.setattr(state.limits, "request_timeout", 0.05)
    with pytest.raises(openai.APIStatusError, match="--request-timeout") as error:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1500, extra_body={"ignore_eos": True})
    assert error.value.status_code == 408
    assert not state.engine.requests  # aborted, not left running


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_disconnects_aborts_its_request(server, state, stream, monkeypatch):
    aborted = []
    abort = state.engine.abort
    monkeypatch.setattr(state.engine, "abort", lambda request_id: aborted.append(abort(request_id)))
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1800, "ignore_eos": True, "stream": stream}
    with httpx.Client(base_url=server.base_url, timeout=httpx.Timeout(30, read=0.3)) as http:
        if stream:
            with http.stream("POST", "/completions", json=body) as response:
                next(response.iter_lines())
        else:
            with pytest.raises(httpx.ReadTimeout):
                http.post("/completions", json=body)
    wait_until(lambda: aborted)
    (output,) = aborted  # the running request, aborted after a part of its 1800 tokens
    assert output.outputs[0].finish_reason == "abort" and len(output.outputs[0].token_ids) < 1800
    assert not state.engine.requests


def wait_until(condition, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
