"""Image parts of chat messages (`{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`) into
what the engine takes: the prompt with each image's pad tokens expanded, and the processor's outputs.

    ids, multi_modal_inputs = chat_images(state, request.messages, ids)   # (ids, None) without images

Only inline `data:` URLs are read: the server downloads nothing, so an http(s) URL is a 400 that says how to send
the image instead. The chat template renders one image pad token per image part; the model's image processor
(loaded from the model folder, `ServingState.processor`) turns the pictures into `pixel_values` and
`image_grid_thw`, and each pad becomes as many pads as the image has tokens, as the processor does for training.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from PIL import Image

from hyflow.data.multimodal import expand_image_pads, image_features
from hyflow.serving.requests import BadRequest
from hyflow.serving.schema import ChatMessage


def decode_image_url(url: str, where: str) -> Image.Image:
    """The RGB picture of an inline `data:image/...;base64,` URL; BadRequest (naming `where`) otherwise."""
    if url.startswith(("http://", "https://")):
        raise BadRequest(
            f"{where}: image_url {url[:80]!r} is a web address, and hyflow serve downloads nothing; send the image "
            "inline as a data URL: data:image/png;base64,<the file's bytes in base64>",
            "messages",
        )
    header, _, data = url.partition(",")
    if not header.startswith("data:image/") or not header.endswith(";base64") or not data:
        raise BadRequest(
            f"{where}: image_url must be data:image/<format>;base64,<data> (got {url[:40]!r}...)", "messages"
        )
    try:
        image = Image.open(io.BytesIO(base64.b64decode(data, validate=True)))
        image.load()
    except (binascii.Error, ValueError, OSError) as error:
        raise BadRequest(f"{where}: the image_url data is not a readable image ({error})", "messages") from error
    return image.convert("RGB")


def message_images(messages: list[ChatMessage]) -> list[Image.Image]:
    """The pictures of the messages' image parts, in order."""
    images = []
    for index, message in enumerate(messages):
        parts = message.content if isinstance(message.content, list) else []
        for k, part in enumerate(parts):
            if part.type == "image_url":
                images.append(decode_image_url(part.image_url.url, f"messages[{index}].content[{k}]"))
    return images


def chat_images(state: Any, messages: list[ChatMessage], ids: list[int]) -> tuple[list[int], dict[str, Any] | None]:
    """(prompt ids with the images' pad tokens expanded, the images' processor outputs), or (ids, None) when the
    messages have no image part."""
    images = message_images(messages)
    if not images:
        return ids, None
    processor = state.processor
    if processor is None or getattr(state.engine, "vision", None) is None:
        raise BadRequest(
            "the messages hold images, but the served model is not a vision-language model with an image "
            "processor; serve one (e.g. Qwen2-VL) or send text only",
            "messages",
        )
    inputs = image_features(processor, images)
    token_id, merge_size = processor.image_token_id, processor.image_processor.merge_size
    if ids.count(token_id) != len(images):
        raise BadRequest(
            f"the chat template rendered {ids.count(token_id)} image placeholders for {len(images)} image parts; "
            "the model's chat template must render {'type': 'image'} content parts",
            "messages",
        )
    expanded, _ = expand_image_pads(ids, [1] * len(ids), inputs["image_grid_thw"], token_id, merge_size)
    return expanded, inputs
