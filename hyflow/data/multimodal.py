"""Images in prompt data (verl's multimodal schema): decoding, placeholders, the processor call, M-RoPE positions.

A multimodal row adds to the verl schema (`hyflow.data.schema`):

    images   list per row of {"bytes": b"...", "path": "..."} (parquet's image struct), file paths, or PIL images
    prompt   messages whose string content holds one "<image>" per image, in order, e.g. "<image>How many?"

`process_prompt` turns one row into what the two consumers need: `multi_modal_data` ({"image": [PIL images]},
for generation) and `multi_modal_inputs` ({"pixel_values": (N_patches, C*T*P*P), "image_grid_thw": (N_images, 3)},
for the training forward), plus the prompt's token ids with each image expanded to its pad tokens (so length
limits count image tokens). `mrope_position_ids` is Qwen2-VL's 3-row rotary index (temporal, height, width).

Videos (`data.video_key`) need a video processor, which transformers builds only with torchvision; they are not
supported yet and a row that has them is refused with that reason.
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch
from PIL import Image

from hyflow.data.schema import RowError

IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER = "<image>", "<video>"


def decode_image(item: Any, error: RowError, column: str, position: int) -> Image.Image:
    """One entry of a row's image list as an RGB PIL image: `{"bytes", "path"}`, a file path, or a PIL image."""
    if isinstance(item, Image.Image):
        return item.convert("RGB")
    where = f"image {position}"
    data, path = (item.get("bytes"), item.get("path")) if isinstance(item, dict) else (None, item)
    if data is None:
        if not isinstance(path, (str, os.PathLike)) or not path:
            raise error(column, f"{where} is {item!r}", 'Store {"bytes": <encoded image>, "path": ...} or a file path.')
        if not os.path.isfile(path):
            raise error(column, f"{where}: the file {os.fspath(path)!r} does not exist", "Fix the path or embed bytes.")
        with open(path, "rb") as f:
            data = f.read()
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except Exception as exc:  # Pillow raises several types for broken data
        raise error(
            column, f"{where} cannot be decoded ({exc})", "Store PNG/JPEG bytes (e.g. PIL's Image.save)."
        ) from exc
    return image.convert("RGB")


def row_images(row: dict[str, Any], image_key: str, video_key: str, error: RowError) -> list[Image.Image]:
    """The row's images, decoded; a row with videos is refused (not supported yet, see the module docstring)."""
    if row.get(video_key):
        raise error(video_key, "video inputs are not supported by hyflow yet", "Remove the column or its entries.")
    items = row.get(image_key) or []
    if not isinstance(items, (list, tuple)):
        raise error(image_key, f"expected a list of images, got {type(items).__name__}", "Store a list per row.")
    return [decode_image(item, error, image_key, i) for i, item in enumerate(items)]


def to_content_parts(messages: list[dict[str, Any]], num_images: int, error: RowError, column: str) -> list[dict]:
    """Messages with "<image>" in string content rewritten as content parts, as multimodal chat templates expect:
    "<image>How many?" -> [{"type": "image"}, {"type": "text", "text": "How many?"}]."""
    converted, found = [], 0
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or IMAGE_PLACEHOLDER not in content:
            converted.append(message)
            continue
        parts: list[dict[str, Any]] = []
        for i, text in enumerate(content.split(IMAGE_PLACEHOLDER)):
            if i > 0:
                parts.append({"type": "image"})
                found += 1
            if text:
                parts.append({"type": "text", "text": text})
        converted.append({**message, "content": parts})
    if found != num_images:
        raise error(
            column,
            f"the prompt has {found} {IMAGE_PLACEHOLDER!r} placeholder(s) but the row has {num_images} image(s)",
            f"Put exactly one {IMAGE_PLACEHOLDER} in the message text per image, in order.",
        )
    return converted


def process_prompt(processor: Any, text: str, images: list[Image.Image]) -> tuple[list[int], dict[str, torch.Tensor]]:
    """(prompt ids with each image's pad tokens expanded, multi_modal_inputs) of one chat-templated prompt."""
    inputs = processor(text=[text], images=images or None, return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    multi_modal_inputs = {key: inputs[key] for key in ("pixel_values", "image_grid_thw") if key in inputs}
    return ids, multi_modal_inputs


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
) -> torch.Tensor:
    """Qwen2-VL's multimodal rotary positions (3, T) of one row (T tokens, left padding allowed).

    Text tokens count up on all three rows alike. The k-th image's block of t·(h/m)·(w/m) pad tokens (grid t, h, w
    of patches, merge size m) gets (start + t_i, start + h_i, start + w_i) for each merged patch in raster order,
    where start is the position after the preceding text; the text after the image resumes at 1 + the block's
    largest position. Padding positions are 0 (as transformers' `get_rope_index` writes them).
    """
    positions = torch.zeros(3, input_ids.shape[0], dtype=torch.long)
    real = attention_mask.bool()
    ids = input_ids[real].tolist()
    grids = iter(image_grid_thw.tolist() if image_grid_thw is not None else [])
    out: list[torch.Tensor] = []
    next_pos, i = 0, 0
    while i < len(ids):
        if ids[i] != image_token_id:
            j = i
            while j < len(ids) and ids[j] != image_token_id:
                j += 1
            out.append(torch.arange(next_pos, next_pos + j - i).expand(3, -1))
            next_pos += j - i
            i = j
            continue
        t, h, w = next(grids)
        h, w = h // spatial_merge_size, w // spatial_merge_size
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
        block = grid.reshape(3, -1) + next_pos
        out.append(block)
        next_pos = int(block.max()) + 1
        i += t * h * w
    if out:
        positions[:, real] = torch.cat(out, dim=1)
    return positions
