"""`hyflow serve` on a tiny Qwen2-VL / Qwen2.5-VL: video parts of chat messages (vLLM's `video_url`, an inline GIF)
reach the engine's video prefill with the frame rate of `mm_processor_kwargs.fps` or of the file, through the
`openai` client; a clip the server cannot take is a 400 that names the part and the fix."""

from __future__ import annotations

import base64
import io

import openai
import pytest
from transformers import AutoTokenizer

from hyflow.data.multimodal import process_prompt
from hyflow.data.schema import RowError
from hyflow.data.video import decode_video
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.models.processor import load_processor
from hyflow.models.tiny_vlm import build_tiny_vlm
from hyflow.serving import ServingState, build_app
from hyflow.serving.server import BackgroundServer

from ..engine.vlm_testkit import random_image
from .conftest import MODEL

QUESTION = "What happens?"
GREEDY = {"max_tokens": 6, "temperature": 0, "extra_body": {"return_token_ids": True, "ignore_eos": True}}


def gif(num_frames: int = 4, frame_ms: int = 250, seed: int = 0) -> bytes:
    """A clip of noise frames (56 x 56 pixels, `frame_ms` apart: 4 frames per second by default) as a GIF file."""
    frames = [random_image(seed + i, size=(56, 56)) for i in range(num_frames)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=frame_ms, loop=0)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/gif") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def png_url(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return data_url(buffer.getvalue(), "image/png")


def video_part(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def _engine(path: str) -> LLMEngine:
    config = EngineConfig(max_model_len=256, num_kv_blocks=64, block_size=16, device="cpu")
    return LLMEngine(path, config, AutoTokenizer.from_pretrained(path))


class Served:
    """A tiny VLM behind a server whose async engine records the multi_modal_inputs of each request."""

    def __init__(self, path: str) -> None:
        self.path, self.processor = path, load_processor(path)
        self.state = ServingState(_engine(path), "tiny-vlm", processor=load_processor(path))
        self.inputs: list[dict] = []
        generate = self.state.async_engine.generate

        async def recording(*args, multi_modal_inputs=None, **kwargs):
            self.inputs.append(multi_modal_inputs)
            return await generate(*args, multi_modal_inputs=multi_modal_inputs, **kwargs)

        self.state.async_engine.generate = recording

    def ask(self, client: openai.OpenAI, parts: list[dict], **extra):
        content = [*parts, {"type": "text", "text": QUESTION}]
        return client.chat.completions.create(
            model="tiny-vlm", messages=[{"role": "user", "content": content}], **extra
        )


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def served(request, tmp_path_factory):
    served = Served(build_tiny_vlm(tmp_path_factory.mktemp(request.param) / "tiny-vlm", arch=request.param))
    with BackgroundServer(build_app(served.state)) as running:
        served.client = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
        yield served


def _expected(served: Served, image, clip: bytes, fps: float | None):
    """The engine's greedy reply, called directly, to the question with (an image and) the clip decoded as the
    data path decodes a row's video file, at `fps` (None: the file's frame rate)."""
    video = decode_video({"video": {"bytes": clip, "path": None}, "fps": fps}, RowError("test", 0), "videos", 0)
    content = ([{"type": "image"}] if image is not None else []) + [
        {"type": "video"},
        {"type": "text", "text": QUESTION},
    ]
    chat = served.processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    prompt, inputs = process_prompt(served.processor, chat, [image] if image is not None else [], [video])
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    return prompt, _engine(served.path).generate([prompt], params, multi_modal_inputs=[inputs])[0].outputs[0]


@pytest.mark.timeout(300)
def test_a_video_part_is_answered_with_the_engines_tokens_for_that_clip(served):
    clip = gif()
    reply = served.ask(served.client, [video_part(data_url(clip))], **GREEDY)
    prompt, expected = _expected(served, None, clip, fps=None)
    assert reply.choices[0].model_extra["token_ids"] == expected.token_ids
    assert reply.choices[0].model_extra["prompt_token_ids"] == prompt  # the clip's pad tokens expanded: 8 of them
    assert prompt.count(served.processor.video_token_id) == 8


def test_a_streamed_video_reply_carries_the_same_tokens(served):
    clip = data_url(gif(seed=20))
    whole = served.ask(served.client, [video_part(clip)], **GREEDY).choices[0].model_extra["token_ids"]
    stream = served.ask(served.client, [video_part(clip)], stream=True, **GREEDY)
    streamed = [token for chunk in stream for token in (chunk.choices[0].model_extra or {}).get("token_ids", [])]
    assert streamed == whole and len(whole) == 6


@pytest.mark.timeout(300)
def test_an_image_beside_a_video_at_the_requests_fps_gives_the_engines_tokens(served):
    image, clip = random_image(7), gif(seed=10)
    parts = [{"type": "image_url", "image_url": {"url": png_url(image)}}, video_part(data_url(clip, "video/gif"))]
    reply = served.ask(
        served.client, parts, **GREEDY | {"extra_body": {**GREEDY["extra_body"], "mm_processor_kwargs": {"fps": 1.0}}}
    )
    prompt, expected = _expected(served, image, clip, fps=1.0)
    assert reply.choices[0].model_extra["token_ids"] == expected.token_ids
    assert reply.choices[0].model_extra["prompt_token_ids"] == prompt


def test_the_frame_rate_is_the_requests_fps_else_the_files(served):
    served.ask(served.client, [video_part(data_url(gif()))], max_tokens=1)
    fps = {"mm_processor_kwargs": {"fps": [1.0, 8.0]}}
    served.ask(served.client, [video_part(data_url(gif()))] * 2, max_tokens=1, extra_body=fps)
    file_rate, per_part = served.inputs[-2], served.inputs[-1]
    if served.state.engine.hf_config.model_type == "qwen2_vl":  # its positions count temporal patches, not seconds
        assert "second_per_grid_ts" not in file_rate and "second_per_grid_ts" not in per_part
        return
    assert file_rate["second_per_grid_ts"].tolist() == [0.5]  # 2 frames per temporal patch at the GIF's 4 fps
    assert per_part["second_per_grid_ts"].tolist() == [2.0, 0.25]


def test_a_clip_named_by_a_file_url_under_the_allowed_directory_is_answered_as_the_same_clip_inline(
    served, tmp_path, monkeypatch
):
    clip = gif(seed=30)
    (tmp_path / "clip.gif").write_bytes(clip)
    monkeypatch.setattr(served.state.limits, "allowed_local_media_path", str(tmp_path))
    from_file = served.ask(served.client, [video_part(f"file://{tmp_path}/clip.gif")], **GREEDY)
    inline = served.ask(served.client, [video_part(data_url(clip))], **GREEDY)
    assert from_file.choices[0].model_extra["token_ids"] == inline.choices[0].model_extra["token_ids"]
    assert served.inputs[-2]["pixel_values_videos"].equal(served.inputs[-1]["pixel_values_videos"])


@pytest.mark.parametrize(
    "url, message",
    [
        ("https://example.com/clip.mp4", r"downloads nothing.*data:image/gif;base64"),
        ("data:text/plain;base64,aGk=", r"video_url must be data:video/<format>;base64"),
        (data_url(b"\x00\x00\x00\x18ftypmp42 not really", "video/mp4"), r"content\[0\].*not a readable clip.*GIF"),
        ("data:video/gif;base64,***", r"content\[0\].*not base64"),
    ],
)
def test_a_clip_the_server_cannot_read_is_a_400_naming_the_part(served, url, message):
    with pytest.raises(openai.BadRequestError, match=message):
        served.ask(served.client, [video_part(url)], max_tokens=1)


def test_a_clip_of_more_frames_than_the_servers_limit_is_a_400_naming_the_flag(served, monkeypatch):
    monkeypatch.setattr(served.state.limits, "max_video_frames", 4)
    with pytest.raises(
        openai.BadRequestError, match=r"5 frames, more than this server's limit of 4.*--max-video-frames"
    ):
        served.ask(served.client, [video_part(data_url(gif(num_frames=5)))], max_tokens=1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"fps": [1.0, 2.0]}, r"mm_processor_kwargs.fps has 2 values for 1 video part"),
        ({"fps": 0}, r"fps=0.*above 0"),
        ({"num_frames": 8}, r"mm_processor_kwargs.num_frames: Extra inputs are not permitted"),
        ({"max_pixels": 3136}, r"max_pixels=3136.*per server.*--mm-processor-kwargs '\{\"max_pixels\": 3136\}'"),
    ],
)
def test_processor_kwargs_hyflow_cannot_follow_are_a_400(served, kwargs, message):
    with pytest.raises(openai.BadRequestError, match=message):
        served.ask(
            served.client, [video_part(data_url(gif()))], max_tokens=1, extra_body={"mm_processor_kwargs": kwargs}
        )


def test_a_video_part_sent_to_a_text_model_is_a_400_that_says_to_serve_a_vlm(client):
    content = [video_part(data_url(gif())), {"type": "text", "text": QUESTION}]
    with pytest.raises(openai.BadRequestError, match=r"hold videos.*not a vision-language model.*Qwen2-VL"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=1)
