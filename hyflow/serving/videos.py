"""Video parts of chat messages, vLLM's `{"type": "video_url", "video_url": {"url": "data:image/gif;base64,..."}}`,
as the clips the processor takes (`hyflow.data.video.Video`: every frame, and the frame rate).

    clips = [part for part in read_media(messages, limits, processor) if part.kind == "video"]   # checked, not decoded
    rates = frame_rates(request.mm_processor_kwargs, len(clips))
    videos = [decode_video(part, fps, limits.max_video_frames) for part, fps in zip(clips, rates)]

As for image parts, the bytes come from an inline `data:` URL, `data:video/<format>;base64,` or
`data:image/<format>;base64,` (a GIF's type is image/gif), or a `file://` URL under `--allowed-local-media-path`
(media_urls.py); the server downloads nothing. Before any clip is decoded, the request's parts are counted and
their headers read against the server's limits (media_budget.py: `--max-video-frames`, `--max-request-pixels`,
`--limit-mm-per-prompt`). A clip is decoded with Pillow, as the data path decodes a row's
video files (hyflow/data/video.py): GIF, animated WebP or animated PNG, no video library. No frame is sampled or
dropped, so a clip of more frames than the server's `--max-video-frames` is refused, not cut.

A clip's frame rate is vLLM's `mm_processor_kwargs.fps` (one number for every video part, or a list with one per
part, as verl gives each video its `fps`), else the file's frame duration, else 2 frames per second (the data
path's default). It tells the model how far apart the frames are: Qwen2.5-VL's temporal positions step by
`tokens_per_second · temporal_patch_size / fps` (`second_per_grid_ts`); Qwen2-VL's do not depend on it.
"""

from __future__ import annotations

import math

from hyflow.data.video import DEFAULT_FPS, Video, decode_clip
from hyflow.serving.errors import BadRequest
from hyflow.serving.media_budget import DECODABLE, MediaPart
from hyflow.serving.schema import ProcessorKwargs


def decode_video(part: MediaPart, fps: float | None, max_frames: int) -> Video:
    """The clip of one video part, read and checked (media_budget.read_media): its RGB frames (all of one size) and
    its frame rate (`fps`, else the file's frame duration, else 2); a BadRequest naming the part when it is not one."""
    try:
        frames, file_fps, _ = decode_clip(part.data, max_frames)
    except Exception as error:  # Pillow raises several types for broken data (OSError, EOFError, SyntaxError, ...)
        message = f"{part.where}: the video_url data is not a readable clip ({error}); send {DECODABLE}"
        raise BadRequest(message, "messages") from error
    sizes = sorted({frame.size for frame in frames})
    if len(sizes) > 1:
        raise BadRequest(f"{part.where}: the clip's frames have sizes {sizes}; give every frame one size", "messages")
    return Video(frames, fps or file_fps or DEFAULT_FPS)


def frame_rates(kwargs: ProcessorKwargs | None, num_videos: int) -> list[float | None]:
    """Each video part's `mm_processor_kwargs.fps` (None where the request gives none), checked."""
    fps = kwargs.fps if kwargs is not None else None
    if fps is None:
        return [None] * num_videos
    rates = list(fps) if isinstance(fps, list) else [fps] * num_videos
    if len(rates) != num_videos:
        raise BadRequest(
            f"mm_processor_kwargs.fps has {len(rates)} values for {num_videos} video part(s); give one number for "
            "all of them or one per video part, in order",
            "mm_processor_kwargs",
        )
    bad = [rate for rate in rates if not math.isfinite(rate) or rate <= 0]
    if bad:
        raise BadRequest(
            f"mm_processor_kwargs.fps={fps!r}: a frame rate must be a number of frames per second above 0",
            "mm_processor_kwargs",
        )
    return rates
