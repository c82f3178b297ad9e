"""`hyflow serve` over real HTTP on loopback: OpenAI-shaped responses with token ids and log-probs, HTTP 400 for
bad requests while the server keeps serving."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from transformers import AutoTokenizer

from hyflow.engine.config import EngineConfig
from hyflow.engine.engine import LLMEngine
from hyflow.models.tiny import build_tiny_model
from hyflow.rollout.server import EngineServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), arch="qwen2", max_position_embeddings=128)
    engine = LLMEngine(path, EngineConfig(block_size=8, num_kv_blocks=64), AutoTokenizer.from_pretrained(path))
    srv = EngineServer(engine, "tiny", "127.0.0.1", 0)
    srv.start()
    yield srv
    srv.stop()


def _call(server, path: str, body: bytes | dict | None = None) -> tuple[int, dict]:
    url = f"http://127.0.0.1:{server.port}{path}"
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.timeout(120)
def test_models_endpoint_lists_the_served_model(server):
    status, body = _call(server, "/v1/models")
    assert status == 200 and body["data"][0]["id"] == "tiny"


@pytest.mark.timeout(120)
def test_completions_return_token_ids_and_log_probs_matching_the_engine(server):
    request = {
        "model": "tiny",
        "prompt": [5, 6, 7, 8],
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 1,
    }
    status, body = _call(server, "/v1/completions", request)
    assert status == 200 and body["object"] == "text_completion"
    choice = body["choices"][0]
    expected = server.engine.generate([[5, 6, 7, 8]], {"max_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert choice["token_ids"] == expected[0].outputs[0].token_ids
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected[0].outputs[0].log_probs, abs=1e-5)
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}


@pytest.mark.timeout(120)
def test_chat_completions_apply_the_chat_template(server):
    request = {"messages": [{"role": "user", "content": "1+1="}], "max_tokens": 4, "temperature": 0, "n": 2}
    status, body = _call(server, "/v1/chat/completions", request)
    assert status == 200 and len(body["choices"]) == 2
    tokenizer = server.engine.tokenizer
    prompt = tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(body["prompt_token_ids"]) == prompt
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["token_ids"] == body["choices"][1]["token_ids"]  # greedy


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        ({"prompt": [], "max_tokens": 3}, "prompt"),
        ({"prompt": [1, 2], "temprature": 0.5}, "unknown parameter 'temprature'"),
        ({"prompt": list(range(3, 200)), "max_tokens": 3}, "max_model_len"),
        ({"prompt": [1, 2], "top_p": 2.0}, "top_p"),
    ],
    ids=["bad-json", "empty-prompt", "unknown-key", "too-long", "bad-value"],
)
def test_bad_requests_get_http_400_and_the_server_keeps_serving(server, body, message):
    status, reply = _call(server, "/v1/completions", body)
    assert status == 400 and message in reply["error"]["message"]
    status, _ = _call(server, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2})
    assert status == 200
