"""Videos in prompt data: decoding a row's videos into frames, and Qwen2-VL's video inputs from the frames.

A row's `videos` column (`data.video_key`) holds one entry per `<video>` placeholder, each either

    a list of frames        every frame as an image entry of the `images` column ({"bytes", "path"}, a path, PIL)
    a video file            {"bytes": ..., "path": ...} or a path, of a format Pillow decodes: GIF, animated
                            WebP / PNG (no network, no video library needed)

Every frame of one video is decoded to RGB and must have the same size. `video_features` gives the training and
generation inputs Qwen2-VL reads, `pixel_values_videos` (Σ t·h·w, C·T·P·P) and `video_grid_thw` (num_videos, 3):
with a video processor (transformers builds one only where torchvision is installed) from it; without, from the
image processor, frame by frame: each frame is resized and normalised like an image, and consecutive groups of
`temporal_patch_size` frames (the last frame repeated to fill the final group, as the video processor does) are
interleaved into one temporal patch per spatial patch, in the video processor's (C, T, P, P) layout.
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch
from PIL import Image, ImageSequence

from hyflow.data.multimodal import decode_image
from hyflow.data.schema import RowError

VIDEO_INPUT_KEYS = ("pixel_values_videos", "video_grid_thw")


def _file_frames(item: Any, error: RowError, column: str, where: str) -> list[Image.Image]:
    """The frames of an encoded video file ({"bytes", "path"} or a path) that Pillow decodes."""
    data, path = (item.get("bytes"), item.get("path")) if isinstance(item, dict) else (None, item)
    if data is None:
        if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
            raise error(column, f"{where}: the file {path!r} does not exist", "Fix the path or embed the bytes.")
        with open(path, "rb") as f:
            data = f.read()
    try:
        with Image.open(io.BytesIO(data)) as video:
            frames = [frame.convert("RGB") for frame in ImageSequence.Iterator(video)]
    except Exception as exc:  # Pillow raises several types for broken data
        raise error(
            column, f"{where} cannot be decoded ({exc})", "Store a list of frames, or a GIF / animated WebP / PNG."
        ) from exc
    return frames


def decode_video(item: Any, error: RowError, column: str, position: int) -> list[Image.Image]:
    """One entry of a row's video list as its RGB frames (all of one size)."""
    where = f"video {position}"
    if isinstance(item, (list, tuple)):
        frames = [decode_image(frame, error, column, i) for i, frame in enumerate(item)]
    else:
        frames = _file_frames(item, error, column, where)
    if not frames:
        raise error(column, f"{where} has no frames", "Give it at least one frame.")
    sizes = sorted({frame.size for frame in frames})
    if len(sizes) > 1:
        raise error(column, f"{where} has frames of sizes {sizes}", "Resize its frames to one size.")
    return frames


def row_videos(row: dict[str, Any], video_key: str, error: RowError) -> list[list[Image.Image]]:
    """The row's videos, each decoded to its frames ([] when the row has none)."""
    items = row.get(video_key)
    if items is None or (hasattr(items, "__len__") and len(items) == 0):
        return []
    if not isinstance(items, (list, tuple)):
        raise error(video_key, f"expected a list of videos, got {type(items).__name__}", "Store a list per row.")
    return [decode_video(item, error, video_key, i) for i, item in enumerate(items)]


def _frames_to_video_patches(frames: list[Image.Image], image_processor: Any) -> tuple[torch.Tensor, list[int]]:
    """One video's (t·h·w, C·T·P·P) patches and its (t, h, w) grid, through the image processor (see the module
    docstring)."""
    inputs = image_processor(images=frames, return_tensors="pt")
    grid = inputs["image_grid_thw"]
    temporal = image_processor.temporal_patch_size
    patch = image_processor.patch_size
    _, h, w = grid[0].tolist()
    # An image's patch repeats its one frame T times: (n, h·w, C, T, P, P) -> the frame, (n, h·w, C, P, P).
    per_frame = inputs["pixel_values"].reshape(len(frames), h * w, -1, temporal, patch, patch)[:, :, :, 0]
    if pad := -len(frames) % temporal:
        per_frame = torch.cat([per_frame, per_frame[-1:].expand(pad, *per_frame.shape[1:])])
    t = per_frame.shape[0] // temporal
    patches = per_frame.reshape(t, temporal, h * w, *per_frame.shape[2:]).permute(0, 2, 3, 1, 4, 5)
    return patches.reshape(t * h * w, -1), [t, h, w]


def video_features(processor: Any, videos: list[list[Image.Image]]) -> dict[str, torch.Tensor]:
    """`pixel_values_videos` and `video_grid_thw` of one row's videos ({} without videos)."""
    if not videos:
        return {}
    video_processor = getattr(processor, "video_processor", None)
    if video_processor is not None:
        inputs = video_processor(videos=videos, return_tensors="pt")
        return {key: inputs[key] for key in VIDEO_INPUT_KEYS}
    patches, grids = zip(*(_frames_to_video_patches(frames, processor.image_processor) for frames in videos))
    return {"pixel_values_videos": torch.cat(patches), "video_grid_thw": torch.tensor(grids, dtype=torch.long)}
