"""Image and video parts of chat messages into what the engine takes: the prompt with each image's and video's pad
tokens expanded, and the processor's outputs.

    ids, multi_modal_inputs = chat_media(state, request, ids)   # (ids, None) without images or videos

Images: `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`; videos: vLLM's
`{"type": "video_url", "video_url": {"url": "data:image/gif;base64,..."}}` (decoded in videos.py, with the
request's `mm_processor_kwargs.fps`). The bytes come from inline `data:` URLs, or `file://` URLs under the
server's `--allowed-local-media-path` (media_urls.py): the server downloads nothing, so an http(s) URL is a 400
that says how to send the image or clip instead. Nothing is decoded before the request's parts have been counted
and their headers checked against the server's limits (media_budget.py: `--limit-mm-per-prompt`,
`--max-video-frames`, `--max-request-pixels`). The chat template renders one pad token per part; the model's
processor (loaded from the model folder, `ServingState.processor`) turns pictures into `pixel_values` /
`image_grid_thw` and clips into `pixel_values_videos` / `video_grid_thw` (and Qwen2.5-VL's `second_per_grid_ts`),
as the data path does for training (hyflow/data/multimodal.py, video.py), and each pad becomes as many pads as its
image or video has tokens.
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

from hyflow.data.multimodal import expand_vision_pads, image_features
from hyflow.data.video import video_features
from hyflow.serving.errors import BadRequest
from hyflow.serving.media_budget import MediaPart, media_urls, read_media
from hyflow.serving.schema import ChatCompletionRequest, ChatMessage
from hyflow.serving.videos import decode_video, frame_rates


def decode_image(part: MediaPart) -> Image.Image:
    """The RGB picture of an image part, read and checked (media_budget.read_media); BadRequest naming the part
    when the data does not decode."""
    try:
        image = Image.open(io.BytesIO(part.data))
        image.load()
    except Exception as error:  # Pillow raises several types for broken data (OSError, EOFError, SyntaxError, ...)
        raise BadRequest(f"{part.where}: the image_url data is not a readable image ({error})", "messages") from error
    return image.convert("RGB")


def check_media_model(state: Any, messages: list[ChatMessage]) -> None:
    """A 400 when the served model cannot take the messages' images or videos (checked before the chat template
    renders them, which a text model's template cannot)."""
    present = {kind for _, kind, _ in media_urls(messages)}
    has_images, has_videos = "image" in present, "video" in present
    if not has_images and not has_videos:
        return
    kinds = " and ".join(kind for kind, present in (("images", has_images), ("videos", has_videos)) if present)
    if state.processor is None or getattr(state.engine, "vision", None) is None:
        raise BadRequest(
            f"the messages hold {kinds}, but the served model is not a vision-language model with a processor; "
            "serve one (Qwen2-VL or Qwen2.5-VL) or send text only",
            "messages",
        )
    model_type = getattr(state.engine.hf_config, "model_type", None)
    takes_videos = getattr(state.engine.hf_config, "video_token_id", None) is not None
    if has_videos and not (takes_videos and getattr(state.processor, "video_token_id", None) is not None):
        raise BadRequest(
            f"the messages hold videos, but the served model ({model_type}) has no video token; serve a Qwen2-VL "
            "or Qwen2.5-VL model for video_url parts, or send the frames as image_url parts",
            "messages",
        )


def _check_pads(ids: list[int], token_id: int, count: int, kind: str) -> None:
    if ids.count(token_id) != count:
        raise BadRequest(
            f"the chat template rendered {ids.count(token_id)} {kind} placeholders for {count} {kind} parts; the "
            f"model's chat template must render {{'type': '{kind}'}} content parts",
            "messages",
        )


def _check_processor_kwargs(request: ChatCompletionRequest) -> None:
    kwargs = request.mm_processor_kwargs
    for key in ("min_pixels", "max_pixels"):
        value = getattr(kwargs, key, None)
        if value is not None:
            raise BadRequest(
                f"mm_processor_kwargs.{key}={value}: hyflow sets the processor's pixel bounds per server, not per "
                f"request; leave it out, or restart the server with --mm-processor-kwargs '{{\"{key}\": {value}}}'",
                "mm_processor_kwargs",
            )


def chat_media(state: Any, request: ChatCompletionRequest, ids: list[int]) -> tuple[list[int], dict[str, Any] | None]:
    """(prompt ids with the images' and videos' pad tokens expanded, their processor outputs), or (ids, None) when
    the messages have no image or video part."""
    messages, limits = request.messages, state.limits
    if not media_urls(messages):
        return ids, None
    check_media_model(state, messages)
    _check_processor_kwargs(request)
    processor = state.processor
    parts = read_media(messages, limits, processor)  # counted, read and checked against the budget, nothing decoded yet
    clips = [part for part in parts if part.kind == "video"]
    rates = frame_rates(request.mm_processor_kwargs, len(clips))
    images = [decode_image(part) for part in parts if part.kind == "image"]
    videos = [decode_video(part, fps, limits.max_video_frames) for part, fps in zip(clips, rates)]
    _check_pads(ids, processor.image_token_id, len(images), "image")
    if videos:
        _check_pads(ids, processor.video_token_id, len(videos), "video")
    inputs = {**image_features(processor, images), **video_features(processor, videos)}
    expanded, _ = expand_vision_pads(processor, ids, [1] * len(ids), inputs)
    return expanded, inputs
