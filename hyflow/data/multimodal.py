"""Images in prompt data (verl's multimodal schema): decoding, placeholders, the processor call, M-RoPE positions.

A multimodal row adds to the verl schema (`hyflow.data.schema`):

    images   list per row of {"bytes": b"...", "path": "..."} (parquet's image struct), file paths, or PIL images
    prompt   messages whose string content holds one "<image>" per image, in order, e.g. "<image>How many?"

`process_prompt` turns one row into what the two consumers need: `multi_modal_data` ({"image": [PIL images]},
for generation) and `multi_modal_inputs` ({"pixel_values": (N_patches, C*T*P*P), "image_grid_thw": (N_images, 3)},
for the training forward), plus the prompt's token ids with each image expanded to its pad tokens (so length
limits count image tokens). `mrope_position_ids` is Qwen2-VL's 3-row rotary index (temporal, height, width).

One image entry is decoded in `hyflow.data.images` (which `hyflow.data.video` shares for its frames). Videos
(`data.video_key`, decoded in `hyflow.data.video`) work alike: one "<video>" per video, their pad tokens
expanded, `pixel_values_videos` / `video_grid_thw` beside the image inputs, and their blocks in the M-RoPE index
(Qwen2-VL's: the temporal row counts temporal patches).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from PIL import Image

from hyflow.data.images import decode_image
from hyflow.data.schema import RowError
from hyflow.data.video import video_features

IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER = "<image>", "<video>"


def row_images(row: dict[str, Any], image_key: str, error: RowError) -> list[Image.Image]:
    """The row's images, decoded ([] when it has none)."""
    items = row.get(image_key)
    items = [] if items is None else items
    if not isinstance(items, (list, tuple)):
        raise error(image_key, f"expected a list of images, got {type(items).__name__}", "Store a list per row.")
    return [decode_image(item, error, image_key, i) for i, item in enumerate(items)]


_PLACEHOLDERS = {IMAGE_PLACEHOLDER: "image", VIDEO_PLACEHOLDER: "video"}
_PLACEHOLDER_SPLIT = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})")


def text_to_parts(text: str) -> list[dict[str, Any]]:
    """ "<image>How many?" -> [{"type": "image"}, {"type": "text", "text": "How many?"}] (and "<video>" alike)."""
    parts: list[dict[str, Any]] = []
    for piece in _PLACEHOLDER_SPLIT.split(text):
        if piece in _PLACEHOLDERS:
            parts.append({"type": _PLACEHOLDERS[piece]})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


def to_content_parts(
    messages: list[dict[str, Any]], num_images: int, error: RowError, column: str, num_videos: int = 0
) -> list[dict]:
    """Messages with "<image>" / "<video>" in string content rewritten as content parts, as multimodal chat
    templates expect; the placeholder counts must match the row's images and videos."""
    converted, found = [], {"image": 0, "video": 0}
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or not _PLACEHOLDER_SPLIT.search(content):
            converted.append(message)
            continue
        parts = text_to_parts(content)
        for part in parts:
            found[part["type"]] = found.get(part["type"], 0) + 1
        converted.append({**message, "content": parts})
    for kind, placeholder, expected in (
        ("image", IMAGE_PLACEHOLDER, num_images),
        ("video", VIDEO_PLACEHOLDER, num_videos),
    ):
        if found[kind] != expected:
            raise error(
                column,
                f"the prompt has {found[kind]} {placeholder!r} placeholder(s) but the row has {expected} {kind}(s)",
                f"Put exactly one {placeholder} in the message text per {kind}, in order.",
            )
    return converted


def process_prompt(
    processor: Any, text: str, images: list[Image.Image], videos: list[list[Image.Image]] | None = None
) -> tuple[list[int], dict[str, torch.Tensor]]:
    """(prompt ids with each image's and video's pad tokens expanded, multi_modal_inputs) of one chat-templated
    prompt: the text tokenized as is, then each single pad token repeated as the processor would expand it."""
    ids = list(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
    multi_modal_inputs = {**image_features(processor, images), **video_features(processor, videos or [])}
    return expand_vision_pads(processor, ids, [1] * len(ids), multi_modal_inputs)[0], multi_modal_inputs


def expand_vision_pads(
    processor: Any, ids: list[int], mask: list[int], multi_modal_inputs: dict[str, torch.Tensor]
) -> tuple[list[int], list[int]]:
    """`expand_image_pads` for the images and then the videos of `multi_modal_inputs`."""
    merge = merge_size(processor)
    ids, mask = expand_image_pads(ids, mask, multi_modal_inputs.get("image_grid_thw"), processor.image_token_id, merge)
    if "video_grid_thw" in multi_modal_inputs:
        grid = multi_modal_inputs["video_grid_thw"]
        ids, mask = expand_image_pads(ids, mask, grid, processor.video_token_id, merge)
    return ids, mask


def merge_size(processor: Any) -> int:
    """Patches merged per side into one language-model token (Qwen2-VL: 2)."""
    return processor.image_processor.merge_size


def image_features(processor: Any, images: list[Image.Image]) -> dict[str, torch.Tensor]:
    """The image processor's outputs for one row's images ({} without images): pixel_values, image_grid_thw."""
    if not images:
        return {}
    inputs = processor.image_processor(images=images, return_tensors="pt")
    return {key: inputs[key] for key in ("pixel_values", "image_grid_thw")}


def expand_image_pads(
    ids: list[int], mask: list[int], image_grid_thw: torch.Tensor | None, image_token_id: int, merge_size: int
) -> tuple[list[int], list[int]]:
    """`ids` with the k-th single image pad token repeated t·h·w / merge_size² times (image k's token count, as the
    processor expands prompts), and `mask` widened alike (each copy keeps the pad's mask value)."""
    counts = iter([] if image_grid_thw is None else (image_grid_thw.prod(-1) // merge_size**2).tolist())
    out_ids: list[int] = []
    out_mask: list[int] = []
    for token, flag in zip(ids, mask):
        repeat = next(counts) if token == image_token_id else 1
        out_ids += [token] * repeat
        out_mask += [flag] * repeat
    return out_ids, out_mask


def mrope_position_ids(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    image_token_id: int,
    spatial_merge_size: int,
    video_grid_thw: torch.Tensor | None = None,
    video_token_id: int | None = None,
    video_time_steps: list[float] | None = None,
) -> torch.Tensor:
    """Qwen2-VL's multimodal rotary positions (3, T) of one row (T tokens, any padding side): the engine's
    `mrope_positions` (hyflow/engine/models/mrope.py, the one owner of the formula) over the row's real tokens,
    0 at padding.

    Text tokens count up on all three rows alike. The k-th image's (or video's) block of t·(h/m)·(w/m) pad tokens
    (grid t, h, w of patches, merge size m) gets (start + ⌊t_i·step⌋, start + h_i, start + w_i) for each merged
    patch in raster order (temporal patches outermost), where start is the position after the preceding text and
    step is 1 except for Qwen2.5-VL's videos (`video_time_steps`: tokens_per_second · second_per_grid_ts per
    video); the text after the block resumes at start + max(h, w)/m, whatever t is (as transformers'
    `get_rope_index` computes it, so training and `transformers.generate` agree).
    """
    from hyflow.engine.models.mrope import mrope_positions  # here: the engine package takes a while to import

    positions = torch.zeros(3, input_ids.shape[0], dtype=torch.long)
    real = attention_mask.bool()
    grids = {image_token_id: [] if image_grid_thw is None else [tuple(g) for g in image_grid_thw.tolist()]}
    time_steps = {}
    if video_token_id is not None:
        grids[video_token_id] = [] if video_grid_thw is None else [tuple(g) for g in video_grid_thw.tolist()]
        time_steps[video_token_id] = video_time_steps
    if real.any():
        positions[:, real] = mrope_positions(input_ids[real].tolist(), grids, spatial_merge_size, time_steps)[0]
    return positions


def row_position_ids(
    processor: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, multi_modal_inputs: dict[str, Any]
) -> torch.Tensor:
    """`mrope_position_ids` of one row with the processor's token ids, its images' and videos' grids and (for
    Qwen2.5-VL) its videos' time steps, tokens_per_second · second_per_grid_ts."""
    from hyflow.engine.models.mrope import video_time_steps
    from hyflow.models.processor import video_tokens_per_second

    time_steps, video_grid_thw = None, multi_modal_inputs.get("video_grid_thw")
    if video_grid_thw is not None:
        seconds = multi_modal_inputs.get("second_per_grid_ts")
        time_steps = video_time_steps(video_tokens_per_second(processor), seconds, video_grid_thw.shape[0])
    return mrope_position_ids(
        input_ids,
        attention_mask,
        multi_modal_inputs.get("image_grid_thw"),
        processor.image_token_id,
        merge_size(processor),
        video_grid_thw,
        getattr(processor, "video_token_id", None),
        time_steps,
    )
