"""Videos in prompt data: decoding a row's videos into frames, and Qwen2-VL's video inputs from the frames.

A row's `videos` column (`data.video_key`) holds one entry per `<video>` placeholder, each either

    a list of frames        every frame as an image entry of the `images` column ({"bytes", "path"}, a path, PIL)
    a video file            {"bytes": ..., "path": ...} or a path, of a format Pillow decodes: GIF, animated
                            WebP / PNG (no network, no video library needed)
    {"video": ..., "fps": x} verl's (qwen-vl-utils') form: either of the above with its frame rate

Every frame of one video is decoded to RGB and must have the same size. A video's frame rate (`Video.fps`) is its
`fps` key, else a file's frame duration, else 2 frames per second (qwen-vl-utils' and transformers' default).
`video_features` gives the training and generation inputs Qwen2-VL reads, `pixel_values_videos` (Σ t·h·w, C·T·P·P)
and `video_grid_thw` (num_videos, 3): with a video processor (transformers builds one only where torchvision is
installed) from it; without, from the image processor, frame by frame: each frame is resized and normalised like
an image, and consecutive groups of `temporal_patch_size` frames (the last frame repeated to fill the final group,
as the video processor does) are interleaved into one temporal patch per spatial patch, in the video processor's
(C, T, P, P) layout. For Qwen2.5-VL, whose M-RoPE spaces a video's temporal positions by time, it adds
`second_per_grid_ts` (num_videos,): the seconds one temporal patch spans, temporal_patch_size / fps (what
transformers' Qwen2.5-VL processor returns).
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image, ImageSequence

from hyflow.data.images import decode_image
from hyflow.data.schema import RowError
from hyflow.models.processor import video_tokens_per_second

VIDEO_INPUT_KEYS = ("pixel_values_videos", "video_grid_thw")
DEFAULT_FPS = 2.0  # frames per second of a video that does not say (qwen-vl-utils' and transformers' default)


@dataclass
class Video:
    """One decoded video: its RGB frames, all of one size, and its frame rate."""

    frames: list[Image.Image]
    fps: float = DEFAULT_FPS


def as_video(item: Video | list[Image.Image]) -> Video:
    """A `Video`, or a bare list of frames (a tool's output, say) at the default frame rate."""
    return item if isinstance(item, Video) else Video(list(item))


def decode_clip(data: bytes, max_frames: int | None = None) -> tuple[list[Image.Image], float | None, int]:
    """(RGB frames, frame rate from the first frame's duration or None, frame count) of an encoded clip Pillow
    decodes (GIF, animated WebP, animated PNG). A clip of more than `max_frames` frames is not decoded (no frames
    returned; its count says why). Raises what Pillow raises for broken data (OSError, EOFError, ...)."""
    with Image.open(io.BytesIO(data)) as clip:
        num_frames = getattr(clip, "n_frames", 1)
        duration_ms = clip.info.get("duration")
        too_long = max_frames is not None and num_frames > max_frames
        frames = [] if too_long else [frame.convert("RGB") for frame in ImageSequence.Iterator(clip)]
    return frames, (1000.0 / duration_ms if duration_ms else None), num_frames


def _file_frames(item: Any, error: RowError, column: str, where: str) -> tuple[list[Image.Image], float | None]:
    """The frames of an encoded video file ({"bytes", "path"} or a path) that Pillow decodes, and its frame rate
    from the first frame's duration (None when the file gives none)."""
    data, path = (item.get("bytes"), item.get("path")) if isinstance(item, dict) else (None, item)
    if data is None:
        if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
            raise error(column, f"{where}: the file {path!r} does not exist", "Fix the path or embed the bytes.")
        with open(path, "rb") as f:
            data = f.read()
    try:
        frames, fps, _ = decode_clip(data)
    except Exception as exc:  # Pillow raises several types for broken data
        raise error(
            column, f"{where} cannot be decoded ({exc})", "Store a list of frames, or a GIF / animated WebP / PNG."
        ) from exc
    return frames, fps


def _frame_rate(value: Any, error: RowError, column: str, where: str) -> float:
    """A video's `fps` entry, checked: a finite number above 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise error(column, f"{where} has fps={value!r}", "Give its frames per second as a number above 0.")
    return float(value)


def decode_video(item: Any, error: RowError, column: str, position: int) -> Video:
    """One entry of a row's video list as its RGB frames (all of one size) and frame rate."""
    where = f"video {position}"
    fps = None
    if isinstance(item, dict) and "video" in item:  # verl's {"video": frames or file, "fps": ...}
        fps = None if item.get("fps") is None else _frame_rate(item["fps"], error, column, where)
        item = item["video"]
    if isinstance(item, (list, tuple)):
        frames = [decode_image(frame, error, column, i) for i, frame in enumerate(item)]
        file_fps = None
    else:
        frames, file_fps = _file_frames(item, error, column, where)
    if not frames:
        raise error(column, f"{where} has no frames", "Give it at least one frame.")
    sizes = sorted({frame.size for frame in frames})
    if len(sizes) > 1:
        raise error(column, f"{where} has frames of sizes {sizes}", "Resize its frames to one size.")
    return Video(frames, fps or file_fps or DEFAULT_FPS)


def row_videos(row: dict[str, Any], video_key: str, error: RowError) -> list[Video]:
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


def video_features(processor: Any, videos: list[Video | list[Image.Image]]) -> dict[str, torch.Tensor]:
    """`pixel_values_videos` and `video_grid_thw` of one row's videos ({} without videos), and for Qwen2.5-VL
    `second_per_grid_ts` (see the module docstring)."""
    if not videos:
        return {}
    clips = [as_video(video) for video in videos]
    video_processor = getattr(processor, "video_processor", None)
    if video_processor is not None:
        inputs = video_processor(videos=[clip.frames for clip in clips], return_tensors="pt")
        features = {key: inputs[key] for key in VIDEO_INPUT_KEYS}
    else:
        image_processor = processor.image_processor
        patches, grids = zip(*(_frames_to_video_patches(clip.frames, image_processor) for clip in clips))
        features = {"pixel_values_videos": torch.cat(patches), "video_grid_thw": torch.tensor(grids, dtype=torch.long)}
    if video_tokens_per_second(processor) is not None:
        temporal = (video_processor or processor.image_processor).temporal_patch_size
        features["second_per_grid_ts"] = torch.tensor([temporal / clip.fps for clip in clips], dtype=torch.float32)
    return features
