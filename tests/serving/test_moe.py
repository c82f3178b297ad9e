"""`hyflow serve` serves a mixture-of-experts model: a chat through the OpenAI client is the engine's own greedy
continuation of the rendered conversation."""

from __future__ import annotations

import openai

from hyflow.engine.config import SamplingParams
from hyflow.models.tiny import build_tiny_model
from hyflow.serving import build_app
from hyflow.serving.server import BackgroundServer

from .conftest import MODEL, make_state


def test_a_moe_model_is_served_and_answers_as_its_engine_does(tmp_path):
    state = make_state(build_tiny_model(tmp_path / "moe", arch="qwen3_moe", hidden_size=32, num_layers=2))
    assert state.engine.model.args.moe is not None
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    with BackgroundServer(build_app(state)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    text = state.engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = state.engine.tokenizer.encode(text, add_special_tokens=False)
    solo = state.engine.generate([prompt], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0]
    assert reply.choices[0].message.content == state.engine.tokenizer.decode(solo.token_ids, skip_special_tokens=True)
    assert reply.usage.completion_tokens == len(solo.token_ids)
