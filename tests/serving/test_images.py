"""`hyflow serve` on a tiny Qwen2-VL: image parts of chat messages (inline data URLs) reach the engine's image
prefill, through the `openai` client; web addresses are refused with a 400 (nothing is downloaded)."""

from __future__ import annotations

import base64
import io

import openai
import pytest
from transformers import AutoTokenizer

from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.models.processor import load_processor
from hyflow.models.tiny_vlm import build_tiny_vlm
from hyflow.serving import ServingState, build_app
from hyflow.serving.server import BackgroundServer

from ..engine.vlm_testkit import engine_inputs, image_prompt, random_image


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory) -> str:
    return build_tiny_vlm(tmp_path_factory.mktemp("serving-vlm") / "tiny-vlm")


def _engine(path: str) -> LLMEngine:
    config = EngineConfig(max_model_len=256, num_kv_blocks=64, block_size=16, device="cpu")
    return LLMEngine(path, config, AutoTokenizer.from_pretrained(path))


@pytest.fixture(scope="module")
def vlm_client(vlm_path):
    state = ServingState(_engine(vlm_path), "tiny-vlm", processor=load_processor(vlm_path))
    with BackgroundServer(build_app(state)) as running:
        yield openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)


def data_url(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _ask(client, url: str, **extra):
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is in the picture?"}]
    return client.chat.completions.create(
        model="tiny-vlm", messages=[{"role": "user", "content": content}], max_tokens=6, temperature=0, **extra
    )


@pytest.mark.timeout(120)
def test_an_image_part_is_answered_with_the_engines_tokens_for_that_image(vlm_client, vlm_path):
    image = random_image(0)
    reply = _ask(vlm_client, data_url(image), extra_body={"return_token_ids": True, "ignore_eos": True})
    prompt, images = engine_inputs(image_prompt(load_processor(vlm_path), [image]))
    expected = _engine(vlm_path).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), multi_modal_inputs=[images]
    )[0]
    choice = reply.choices[0]
    assert choice.model_extra["token_ids"] == expected.outputs[0].token_ids
    assert choice.model_extra["prompt_token_ids"] == prompt  # the image's pad tokens expanded as the processor does
    assert reply.usage.prompt_tokens == len(prompt)


def test_a_web_address_is_refused_with_a_400_that_says_to_send_a_data_url(vlm_client):
    with pytest.raises(openai.BadRequestError, match=r"downloads nothing.*data:image/png;base64"):
        _ask(vlm_client, "https://example.com/cat.png")


def test_undecodable_image_data_is_a_400_naming_the_part(vlm_client):
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[0\].*not a readable image"):
        _ask(vlm_client, "data:image/png;base64," + base64.b64encode(b"not a png").decode())
