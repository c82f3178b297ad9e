"""A bounded load test: 500 concurrent requests (half of them streamed, half chat) on 127.0.0.1 against the tiny
model on CPU all succeed, every greedy output equals the engine's solo run of its prompt, and the server is
healthy and idle afterwards."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from hyflow.agent.chat import encode_prompt
from hyflow.engine.config import SamplingParams
from hyflow.serving import build_app
from hyflow.serving.server import BackgroundServer

from .conftest import MODEL, make_state

NUM_REQUESTS = 500
MAX_TOKENS = 6
WORDS = ["fox", "dog", "cat", "owl", "bee", "elk", "ram", "yak", "emu", "ant"]


def prompt_of(i: int) -> str:
    return f"The {WORDS[i % 10]} and the {WORDS[(i // 10) % 10]} number {i % 7}"


async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, str]:
    """Request i: a completion or a chat, streamed or not (i % 4), greedy; returns its text."""
    greedy = {"temperature": 0, "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}}
    stream = i % 2 == 1
    if i % 4 < 2:
        response = await client.completions.create(model=MODEL, prompt=prompt_of(i), stream=stream, **greedy)
        if not stream:
            return i, response.choices[0].text
        return i, "".join([chunk.choices[0].text async for chunk in response if chunk.choices])
    messages = [{"role": "user", "content": prompt_of(i)}]
    response = await client.chat.completions.create(model=MODEL, messages=messages, stream=stream, **greedy)
    if not stream:
        return i, response.choices[0].message.content
    return i, "".join([chunk.choices[0].delta.content or "" async for chunk in response if chunk.choices])


def solo_texts(state) -> dict[int, str]:
    """Each request's greedy text from the engine alone, one prompt at a time."""
    tokenizer, params = state.tokenizer, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    texts = {}
    for i in range(NUM_REQUESTS):
        if i % 4 < 2:
            ids = tokenizer.encode(prompt_of(i), add_special_tokens=False)
        else:
            ids = encode_prompt(tokenizer, [{"role": "user", "content": prompt_of(i)}])
        texts[i] = state.engine.generate([ids], params)[0].outputs[0].text
    return texts


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_500_concurrent_requests_all_succeed_with_their_solo_outputs_and_leave_the_server_healthy(model_path):
    state = make_state(model_path, max_model_len=256, num_kv_blocks=2048, max_num_seqs=256)
    expected = solo_texts(state)

    async def main():
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300) as client:
            return await asyncio.gather(*(one(client, i) for i in range(NUM_REQUESTS)), return_exceptions=True)

    with BackgroundServer(build_app(state)) as server:
        results = asyncio.run(main())
        failures = [r for r in results if isinstance(r, BaseException)]
        assert not failures, f"{len(failures)} of {NUM_REQUESTS} failed, e.g. {failures[0]!r}"
        assert dict(results) == expected
        assert httpx.get(server.base_url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
        assert not state.engine.requests and not state.engine.has_unfinished_requests()
