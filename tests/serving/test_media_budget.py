"""The per-request media budget of `hyflow serve`: a request's images and video frames may decode to at most
`--max-request-pixels` pixels together, and carry at most `--limit-mm-per-prompt` parts of a modality; both are
checked from the files' headers, so a crafted huge canvas is refused without being decoded, and the server goes on
serving the requests under budget as before."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import openai
import pytest
from PIL import Image
from transformers import AutoTokenizer

import hyflow.serving.media as media
import hyflow.serving.media_urls as media_urls
from hyflow.engine.config import EngineConfig
from hyflow.engine.engine import LLMEngine
from hyflow.models.processor import load_processor
from hyflow.models.tiny_vlm import build_tiny_vlm
from hyflow.serving import ServerLimits, ServingState, build_app
from hyflow.serving.media_budget import HEADER_BYTES, parse_limit_mm_per_prompt
from hyflow.serving.server import BackgroundServer, build_state, parse_args
from hyflow.serving.state import keep_pillow_bound_above

from ..engine.vlm_testkit import random_image


def crafted_gif(width: int, height: int, num_frames: int) -> bytes:
    """A GIF whose header declares a `width` x `height` canvas, holding `num_frames` frames of one pixel each: a
    file of a few hundred bytes that Pillow would decode to width · height pixels per frame."""
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    frame = (
        b"\x21\xf9\x04\x00\x0a\x00\x00\x00" + b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    )
    return screen + frame * num_frames + b"\x3b"


def crafted_png(width: int, height: int) -> bytes:
    """A PNG whose header declares `width` x `height` RGB pixels, with (almost) no pixel data behind it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(b"\x00")) + chunk(b"IEND", b"")


def url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_part(image: Image.Image) -> dict:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return {"type": "image_url", "image_url": {"url": url(buffer.getvalue(), "image/png")}}


def video_part(data: bytes) -> dict:
    return {"type": "video_url", "video_url": {"url": url(data, "image/gif")}}


def small_gif(num_frames: int) -> bytes:
    frames = [random_image(i, size=(56, 56)) for i in range(num_frames)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=250, loop=0)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory) -> str:
    return build_tiny_vlm(tmp_path_factory.mktemp("budget") / "tiny-vlm")


@pytest.fixture(scope="module")
def served(vlm_path):
    path = vlm_path
    engine = LLMEngine(
        path,
        EngineConfig(max_model_len=512, num_kv_blocks=64, block_size=16, device="cpu"),
        AutoTokenizer.from_pretrained(path),
    )
    state = ServingState(engine, "tiny-vlm", processor=load_processor(path))
    with BackgroundServer(build_app(state)) as running:
        yield state, openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def decoded(monkeypatch) -> list[str]:
    """The parts the server decodes (by where they are in the request), recorded as they are decoded."""
    seen: list[str] = []
    decode_image, decode_video = media.decode_image, media.decode_video

    def recording_image(part):
        seen.append(part.where)
        return decode_image(part)

    def recording_video(part, fps, max_frames):
        seen.append(part.where)
        return decode_video(part, fps, max_frames)

    monkeypatch.setattr(media, "decode_image", recording_image)
    monkeypatch.setattr(media, "decode_video", recording_video)
    return seen


@pytest.fixture
def files_read(served, monkeypatch, tmp_path) -> list[int]:
    """Serves `file://` parts from `tmp_path`, and records the bytes each read of such a file returns."""
    state, _ = served
    monkeypatch.setattr(state.limits, "allowed_local_media_path", str(tmp_path))
    counts: list[int] = []

    class Recorded(io.FileIO):
        def read(self, size: int = -1) -> bytes:
            data = super().read(size)
            counts.append(len(data))
            return data

    monkeypatch.setattr(media_urls, "open", lambda path, mode="r": Recorded(path, mode), raising=False)
    return counts


def file_part(path, kind: str = "image") -> dict:
    return {"type": f"{kind}_url", f"{kind}_url": {"url": f"file://{path}"}}


def ask(client: openai.OpenAI, parts: list[dict], stream: bool = False):
    content = [*parts, {"type": "text", "text": "What is it?"}]
    messages = [{"role": "user", "content": content}]
    return client.chat.completions.create(
        model="tiny-vlm", messages=messages, max_tokens=2, temperature=0, stream=stream
    )


def test_a_gif_declaring_a_huge_canvas_is_refused_from_its_header_without_being_decoded(served, decoded):
    _, client = served
    bomb = crafted_gif(4000, 4000, num_frames=20)  # 320 million pixels to decode, from a file of under 300 bytes
    message = (
        r"decode to 320,000,000 pixels \(messages\[0\]\.content\[0\]: a 20-frame 4000x4000 video.*more than "
        r"this server's limit of 67,108,864 pixels per request.*--max-request-pixels"
    )
    with pytest.raises(openai.BadRequestError, match=message):
        ask(client, [video_part(bomb)])
    assert decoded == []


def test_a_png_declaring_more_pixels_than_the_budget_is_refused_without_being_decoded(served, decoded, monkeypatch):
    state, client = served
    monkeypatch.setattr(state.limits, "max_request_pixels", 1_000_000)
    with pytest.raises(openai.BadRequestError, match=r"a 8000x8000 image, 64,000,000 pixels.*1,000,000 pixels"):
        ask(client, [{"type": "image_url", "image_url": {"url": url(crafted_png(8000, 8000), "image/png")}}])
    assert decoded == []


def test_a_canvas_past_pillows_own_bound_is_refused_as_over_the_budget(served, decoded):
    _, client = served
    with pytest.raises(
        openai.BadRequestError,
        match=r"content\[0\]: the video's header declares more pixels.*"
        r"--max-request-pixels",
    ):
        ask(client, [video_part(crafted_gif(65535, 65535, num_frames=1))])
    assert decoded == []


def test_several_images_over_the_summed_budget_are_refused_and_the_server_serves_the_next_request(
    served, decoded, monkeypatch
):
    state, client = served
    monkeypatch.setattr(state.limits, "max_request_pixels", 2 * 56 * 56)
    images = [image_part(random_image(seed, size=(56, 56))) for seed in range(3)]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match=r"decode to 9,408 pixels .*limit of 6,272 pixels"):
            ask(client, images, stream=stream)
    assert decoded == []
    reply = ask(client, images[:2])  # exactly the budget: answered as before
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert decoded == ["messages[0].content[0]", "messages[0].content[1]"]


def test_pictures_smaller_than_the_processors_min_pixels_count_as_what_it_enlarges_them_to(
    served, decoded, monkeypatch
):
    state, client = served
    min_pixels = state.processor.image_processor.size["shortest_edge"]  # 784 for the tiny Qwen2-VL
    monkeypatch.setattr(state.limits, "max_request_pixels", 5 * min_pixels - 1)
    dots = [image_part(Image.new("RGB", (1, 1), "red"))] * 5  # 5 decoded pixels; the processor makes 5 * 784
    message = rf"decode to {5 * min_pixels:,} pixels.*a 1x1 image, {min_pixels:,} pixels \(enlarged to the processor"
    with pytest.raises(openai.BadRequestError, match=message):
        ask(client, dots)
    assert decoded == []


def test_images_and_video_frames_count_against_one_budget(served, decoded, monkeypatch):
    state, client = served
    parts = [image_part(random_image(0, size=(56, 56))), video_part(small_gif(num_frames=4))]
    monkeypatch.setattr(state.limits, "max_request_pixels", 5 * 56 * 56 - 1)
    with pytest.raises(openai.BadRequestError, match=r"decode to 15,680 pixels.*a 4-frame 56x56 video, 12,544"):
        ask(client, parts)
    monkeypatch.setattr(state.limits, "max_request_pixels", 5 * 56 * 56)
    assert ask(client, parts).choices[0].finish_reason in ("stop", "length")
    assert decoded == ["messages[0].content[0]", "messages[0].content[1]"]


def test_more_parts_of_a_modality_than_limit_mm_per_prompt_is_a_400_naming_the_flag(served, decoded, monkeypatch):
    state, client = served
    monkeypatch.setattr(state.limits, "limit_mm_per_prompt", {"image": 1, "video": 0})
    image = image_part(random_image(1, size=(56, 56)))
    with pytest.raises(
        openai.BadRequestError, match=r"At most 1 image\(s\).*this request has 2.*--limit-mm-per-prompt"
    ):
        ask(client, [image, image])
    with pytest.raises(openai.BadRequestError, match=r"At most 0 video\(s\)"):
        ask(client, [video_part(small_gif(num_frames=2))])
    assert decoded == []
    assert ask(client, [image]).choices[0].finish_reason in ("stop", "length")


def test_the_serve_flags_reach_the_servers_limits_and_its_processors_resize(vlm_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # restored after the test
    flags = ["--max-request-pixels", "300000000", "--limit-mm-per-prompt", '{"image": 4, "video": {"count": 1}}']
    flags += ["--mm-processor-kwargs", '{"max_pixels": 3136}']
    state = build_state(parse_args(["--model", vlm_path, "--max-model-len", "256", *flags]))
    assert state.limits.max_request_pixels == 300_000_000 and state.limits.limit_mm_per_prompt == {
        "image": 4,
        "video": 1,
    }
    assert state.processor.image_processor.size["longest_edge"] == 3136  # max_pixels, as data.max_pixels gives it
    assert Image.MAX_IMAGE_PIXELS == 300_000_000  # Pillow's own refusal stays above the budget
    default = parse_args(["--model", vlm_path])
    assert default.limit_mm_per_prompt == {} and default.mm_processor_kwargs == {}
    assert default.max_request_pixels == ServerLimits.max_request_pixels == 2**26


@pytest.mark.parametrize("kwargs", ['{"fps": 2}', '{"max_pixels": 0}', "max_pixels=5"])
def test_processor_kwargs_the_server_cannot_follow_stop_it_at_start_naming_the_flag(kwargs, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--mm-processor-kwargs", kwargs])
    assert "--mm-processor-kwargs" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"audio": 1}', r"'audio' is not a modality"),
        ('{"image": -1}', r"image=-1 must be a count"),
        ('{"image": {"count": 2, "width": 512}}', r"reads no size hints.*--max-request-pixels"),
        ("image=2", r"is not JSON.*'\{\"image\": 4, \"video\": 1\}'"),
    ],
)
def test_a_limit_mm_per_prompt_hyflow_cannot_follow_is_an_error_naming_it(text, message):
    with pytest.raises(ValueError, match=message):
        parse_limit_mm_per_prompt(text)


def test_a_budget_above_pillows_bound_raises_pillows_bound_with_it(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    keep_pillow_bound_above(5000)
    assert Image.MAX_IMAGE_PIXELS == 5000
    keep_pillow_bound_above(10)
    assert Image.MAX_IMAGE_PIXELS == 5000


def test_a_serving_state_built_in_process_raises_pillows_bound_to_its_own_budget(monkeypatch, vlm_path):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    engine = LLMEngine(
        vlm_path,
        EngineConfig(max_model_len=64, num_kv_blocks=8, block_size=16, device="cpu"),
        AutoTokenizer.from_pretrained(vlm_path),
    )
    ServingState(engine, "tiny-vlm", limits=ServerLimits(max_request_pixels=5000))
    assert Image.MAX_IMAGE_PIXELS == 5000


def test_a_file_over_max_request_bytes_is_a_413_naming_the_flag_before_any_of_it_is_read(
    served, files_read, monkeypatch, tmp_path
):
    state, client = served
    monkeypatch.setattr(state.limits, "max_request_bytes", 10_000)
    buffer = io.BytesIO()
    random_image(3, size=(112, 112)).save(buffer, format="BMP")  # 37,686 bytes
    (tmp_path / "large.bmp").write_bytes(buffer.getvalue())
    message = r"file:// media come to 37,686 bytes.*content\[0\].*limit of 10,000 bytes.*--max-request-bytes"
    with pytest.raises(openai.APIStatusError, match=message) as refused:
        ask(client, [file_part(tmp_path / "large.bmp")])
    assert refused.value.status_code == 413
    assert files_read == []


def test_a_file_declaring_a_huge_canvas_is_refused_from_its_first_bytes(
    served, decoded, files_read, monkeypatch, tmp_path
):
    state, client = served
    monkeypatch.setattr(state.limits, "max_request_pixels", 1_000_000)
    (tmp_path / "bomb.png").write_bytes(crafted_png(8000, 8000) + bytes(4 * HEADER_BYTES))  # junk after its end
    with pytest.raises(openai.BadRequestError, match=r"a 8000x8000 image, 64,000,000 pixels.*1,000,000 pixels"):
        ask(client, [file_part(tmp_path / "bomb.png")])
    assert sum(files_read) <= HEADER_BYTES and decoded == []


def test_a_file_whose_header_lies_past_its_first_bytes_is_read_in_full_and_served(
    served, decoded, files_read, tmp_path
):
    _, client = served
    buffer = io.BytesIO()
    random_image(4, size=(56, 56)).save(buffer, format="JPEG", icc_profile=bytes(3 * HEADER_BYTES))
    (tmp_path / "photo.jpg").write_bytes(buffer.getvalue())
    reply = ask(client, [file_part(tmp_path / "photo.jpg")])
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert decoded == ["messages[0].content[0]"] and sum(files_read) >= len(buffer.getvalue())


def test_a_tiff_clip_whose_pages_differ_in_size_is_refused_by_its_format_without_being_decoded(served, decoded):
    _, client = served
    buffer = io.BytesIO()  # its header states the first page's 1x1; the second page decodes to 600x600
    Image.new("RGB", (1, 1)).save(buffer, format="TIFF", save_all=True, append_images=[Image.new("RGB", (600, 600))])
    clip = {"type": "video_url", "video_url": {"url": url(buffer.getvalue(), "image/tiff")}}
    with pytest.raises(openai.BadRequestError, match=r"content\[0\]: the video is a TIFF file.*GIF, WEBP, PNG"):
        ask(client, [clip])
    assert decoded == []


def test_an_image_of_a_format_the_budget_does_not_read_is_refused_naming_the_formats_it_takes(served, decoded):
    _, client = served
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(buffer, format="ICO", sizes=[(16, 16), (64, 64)])
    icon = {"type": "image_url", "image_url": {"url": url(buffer.getvalue(), "image/x-icon")}}
    with pytest.raises(openai.BadRequestError, match=r"the image is a ICO file.*send PNG or JPEG"):
        ask(client, [icon])
    assert decoded == []
