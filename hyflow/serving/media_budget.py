"""How much media one chat request may carry, checked before any picture is decoded: the number of image and video
parts (`--limit-mm-per-prompt`, vLLM's flag and JSON form, e.g. '{"image": 4, "video": 1}'; unset, no count), the
frames of each clip (`--max-video-frames`), and the pixels the images and every video frame decode to, together
(`--max-request-pixels`, hyflow's: vLLM has no such bound).

    parts = read_media(request.messages, state.limits, state.processor)   # bytes, canvas, frames; or a 400

In order: the parts are counted; the `file://` parts' sizes (from stat, none read yet) must come to at most
`--max-request-bytes` together, the bound the request body puts on inline data (a 413 above, as for a body too
large); each part's header is read, of a file only its first `HEADER_BYTES`, and the pixels the headers declare (a
clip's first frame) are checked against the budget, so a file declaring a huge canvas is refused without being
read; then the files are read (no more than their checked sizes), each clip's frames are counted, and the request's
pixels are checked in full.

Pillow's `Image.open` is lazy: it reads the file's header, which gives the canvas size (and a clip's frame count:
a GIF's frames are skipped over without decoding them; WebP and APNG state it), and decodes nothing until
`load()`. So a tiny file that declares a huge canvas (a decompression bomb), or a request of many large pictures,
is refused from the headers alone, and the rest of the server keeps serving. A picture decodes to width · height
RGB pixels (an animated image part: its first frame); a clip to width · height · frames (every GIF frame is
decoded at the canvas size). Pillow refuses on its own a header above twice `PIL.Image.MAX_IMAGE_PIXELS` (its
`DecompressionBombError`); `hyflow serve` keeps that above `--max-request-pixels`, so such a part is over the
budget too and gets the same 400.

The budget trusts a header only where it states what decoding makes: an image part must be one of
`IMAGE_FORMATS` (decoded at the size its header gives: its first frame), a video part one of `VIDEO_FORMATS`
(every frame decoded at the canvas size). Any other format is a 400 naming it before anything is decoded: for
instance a multi-page TIFF states only its first page's size, and its other pages may each be any size.

After decoding, the model's processor resizes each picture (and each frame) into its `min_pixels` .. `max_pixels`
(Qwen2-VL's image processor, from the model folder or `--mm-processor-kwargs`), which bounds the tokens it
becomes: a picture over `max_pixels` is shrunk, not refused, but one under `min_pixels` is enlarged to it. So a
part counts max(width · height, min_pixels) per frame: the budget bounds the larger of what decoding and what the
processor make, and a request of thousands of one-pixel images is refused as surely as one huge canvas.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

from PIL import Image

from hyflow.serving.errors import BadRequest
from hyflow.serving.media_urls import Kind, MediaSource, locate
from hyflow.serving.schema import ChatMessage
from hyflow.serving.state import ServerLimits

DECODABLE = "a GIF, an animated WebP or an animated PNG (convert other formats first, e.g. with ffmpeg)"
MODALITIES = ("image", "video")
IMAGE_FORMATS = ("PNG", "JPEG", "MPO", "GIF", "WEBP", "BMP", "TIFF")  # Pillow's names
VIDEO_FORMATS = ("GIF", "WEBP", "PNG")
HEADER_BYTES = 2**16  # what is read of a file before its header passes the budget


@dataclass
class MediaPart:
    """One image or video part of a request, read but not decoded."""

    where: str  # "messages[i].content[k]"
    kind: Kind
    data: bytes
    size: tuple[int, int]  # the canvas (width, height) the header declares
    num_frames: int  # a clip's frame count (1 for an image part, which decodes its first frame only)
    min_pixels: int = 0  # the fewest pixels the processor resizes a frame to (it enlarges smaller ones)
    from_head: bool = False  # read from a file's first HEADER_BYTES only: a clip's frames are not counted yet

    @property
    def pixels(self) -> int:
        """What the part costs: max(width · height, min_pixels) per frame."""
        return max(self.size[0] * self.size[1], self.min_pixels) * self.num_frames

    def describe(self) -> str:
        frames = f"{self.num_frames}-frame " if self.kind == "video" and not self.from_head else ""
        enlarged = " (enlarged to the processor's min_pixels)" if self.size[0] * self.size[1] < self.min_pixels else ""
        first = " in its first frame" if self.kind == "video" and self.from_head else ""
        shown = f"{self.size[0]}x{self.size[1]} {self.kind}, {self.pixels:,} pixels{first}{enlarged}"
        return f"{self.where}: a {frames}{shown}"


def parse_limit_mm_per_prompt(text: str) -> dict[str, int]:
    """`--limit-mm-per-prompt` as {modality: most parts}: a JSON object such as '{"image": 4, "video": 1}' (a
    value may also be vLLM's {"count": N}); a ValueError naming the problem otherwise (argparse names the flag)."""
    example = '\'{"image": 4, "video": 1}\''
    try:
        limits = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{text!r} is not JSON ({error}); give e.g. {example}") from None
    if not isinstance(limits, dict):
        raise ValueError(f"{text!r} must be a JSON object such as {example}")
    parsed = {}
    for modality, value in limits.items():
        if modality not in MODALITIES:
            raise ValueError(f"{modality!r} is not a modality hyflow serves; use {MODALITIES}")
        if isinstance(value, dict) and set(value) == {"count"}:
            value = value["count"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"{modality}={value!r} must be a count of 0 or more (hyflow reads no size "
                "hints: bound sizes with --max-request-pixels)"
            )
        parsed[modality] = value
    return parsed


def media_urls(messages: list[ChatMessage]) -> list[tuple[str, Kind, str]]:
    """(where, kind, url) of the messages' image and video parts, in order."""
    found = []
    for index, message in enumerate(messages):
        parts = message.content if isinstance(message.content, list) else []
        for k, part in enumerate(parts):
            if part.type == "image_url":
                found.append((f"messages[{index}].content[{k}]", "image", part.image_url.url))
            elif part.type == "video_url":
                found.append((f"messages[{index}].content[{k}]", "video", part.video_url.url))
    return found


def check_counts(urls: list[tuple[str, Kind, str]], limits: dict[str, int]) -> None:
    """A 400 when the request has more parts of a modality than `--limit-mm-per-prompt` allows."""
    for modality, limit in limits.items():
        count = sum(kind == modality for _, kind, _ in urls)
        if count > limit:
            raise BadRequest(
                f"At most {limit} {modality}(s) may be provided in one prompt; this request has {count}. Send fewer, "
                "or restart the server with a larger --limit-mm-per-prompt",
                "messages",
            )


def min_frame_pixels(processor: Any, kind: Kind) -> int:
    """The fewest pixels the processor resizes a picture or a clip's frame to (Qwen2-VL's `min_pixels`, kept as
    `size["shortest_edge"]`; a clip's from the video processor where there is one, as data/video.py uses it); 0
    when it names none."""
    source = (getattr(processor, "video_processor", None) if kind == "video" else None) or processor.image_processor
    size = getattr(source, "size", None)
    value = getattr(source, "min_pixels", None) or (size.get("shortest_edge") if hasattr(size, "get") else None)
    return int(value or 0)


def _bomb(where: str, kind: Kind, max_request_pixels: int, error: Exception) -> BadRequest:
    return BadRequest(
        f"{where}: the {kind}'s header declares more pixels than Pillow decodes ({error}), which is more than "
        f"this server's limit of {max_request_pixels:,} pixels per request; send a smaller {kind}, or restart "
        "the server with a larger --max-request-pixels",
        "messages",
    )


def check_format(where: str, kind: Kind, image_format: str | None) -> None:
    """A 400 when the budget cannot read from the header of this format what the part decodes to."""
    allowed = IMAGE_FORMATS if kind == "image" else VIDEO_FORMATS
    if image_format not in allowed:
        shown = "PNG or JPEG" if kind == "image" else DECODABLE
        raise BadRequest(
            f"{where}: the {kind} is a {image_format} file, a format whose header does not state what it decodes "
            f"to, so this server cannot check it against its pixel budget; send {shown} (formats taken: "
            f"{', '.join(allowed)})",
            "messages",
        )


def probe(where: str, kind: Kind, data: bytes, max_request_pixels: int) -> MediaPart:
    """A part's canvas size and frame count from its header (nothing decoded); a 400 naming `where` when the data
    is not a picture (or clip) Pillow reads, is of a format the budget cannot read (`check_format`), or declares
    more pixels than Pillow's own bound."""
    try:
        with Image.open(io.BytesIO(data)) as picture:
            check_format(where, kind, picture.format)
            num_frames = getattr(picture, "n_frames", 1) if kind == "video" else 1
            return MediaPart(where, kind, data, picture.size, num_frames)
    except Image.DecompressionBombError as error:
        raise _bomb(where, kind, max_request_pixels, error) from error
    except BadRequest:
        raise
    except Exception as error:  # Pillow raises several types for broken data (OSError, EOFError, SyntaxError, ...)
        shown = f"clip ({error}); send {DECODABLE}" if kind == "video" else f"image ({error})"
        raise BadRequest(f"{where}: the {kind}_url data is not a readable {shown}", "messages") from error


def check_frames(part: MediaPart, max_frames: int) -> None:
    if part.kind == "video" and part.num_frames > max_frames:
        raise BadRequest(
            f"{part.where}: the clip has {part.num_frames} frames, more than this server's limit of {max_frames}; "
            "sample it down to fewer frames (and give their rate as mm_processor_kwargs.fps), or restart the server "
            "with a larger --max-video-frames",
            "messages",
        )


def check_pixels(parts: list[MediaPart], max_request_pixels: int) -> None:
    """A 400 when the parts decode to more pixels, together, than `--max-request-pixels`; it lists the largest."""
    total = sum(part.pixels for part in parts)
    if total <= max_request_pixels:
        return
    largest = sorted(parts, key=lambda part: part.pixels, reverse=True)[:3]
    shown = "; ".join(part.describe() for part in largest) + ("; ..." if len(parts) > len(largest) else "")
    raise BadRequest(
        f"the request's images and video frames decode to {total:,} pixels ({shown}), more than this server's "
        f"limit of {max_request_pixels:,} pixels per request; send fewer or smaller images or clips (or fewer "
        "frames), or restart the server with a larger --max-request-pixels",
        "messages",
    )


def check_file_bytes(sources: list[MediaSource], max_request_bytes: int) -> None:
    """A 413 when the request's `file://` parts hold more bytes, together, than `--max-request-bytes` (which bounds
    the inline parts, inside the request body, too): their sizes from stat, nothing read."""
    files = [source for source in sources if source.path is not None]
    total = sum(source.num_bytes for source in files)
    if total <= max_request_bytes:
        return
    largest = max(files, key=lambda source: source.num_bytes)
    raise BadRequest(
        f"the request's file:// media come to {total:,} bytes (the largest, {largest.where}, is a file of "
        f"{largest.num_bytes:,} bytes), more than this server's limit of {max_request_bytes:,} bytes per request "
        "(--max-request-bytes, which bounds inline data too); send smaller files, or restart the server with a "
        "larger --max-request-bytes",
        "messages",
        status=413,
    )


def glance(source: MediaSource, max_request_pixels: int) -> MediaPart | None:
    """What a file part's header declares, from its first `HEADER_BYTES` (a clip's first frame only: a lower bound
    of its cost); an inline part in full (`probe`). None when Pillow cannot read the file's header from its first
    bytes (a JPEG with large metadata, say): the whole file is then read, within its checked size, and probed."""
    if source.data is not None:
        return probe(source.where, source.kind, source.data, max_request_pixels)
    try:
        with Image.open(io.BytesIO(source.head(HEADER_BYTES))) as picture:
            check_format(source.where, source.kind, picture.format)
            return MediaPart(source.where, source.kind, b"", picture.size, 1, from_head=True)
    except Image.DecompressionBombError as error:
        raise _bomb(source.where, source.kind, max_request_pixels, error) from error
    except BadRequest:
        raise
    except Exception:  # a header that goes on past the first bytes: probed in full once read
        return None


def _check_budget(parts: list[MediaPart], processor: Any, max_request_pixels: int) -> None:
    for part in parts:
        part.min_pixels = min_frame_pixels(processor, part.kind)
    check_pixels(parts, max_request_pixels)


def read_media(messages: list[ChatMessage], limits: ServerLimits, processor: Any) -> list[MediaPart]:
    """The messages' image and video parts, in order, read and checked against the server's limits (counts; the
    files' sizes; the headers, of a file only its first bytes, against the pixel budget; then the files read, every
    clip's frames counted and the request's pixels checked, at least the `processor`'s min_pixels per frame), none
    decoded."""
    urls = media_urls(messages)
    check_counts(urls, limits.limit_mm_per_prompt)
    root, budget = limits.allowed_local_media_path, limits.max_request_pixels
    sources = [locate(url, where, kind, root) for where, kind, url in urls]
    check_file_bytes(sources, limits.max_request_bytes)
    glanced = [glance(source, budget) for source in sources]
    known = [part for part in glanced if part is not None]
    for part in known:
        check_frames(part, limits.max_video_frames)  # a file's clip counts one frame until it is read
    _check_budget(known, processor, budget)  # before any file is read
    parts = [
        part if part is not None and not part.from_head else probe(source.where, source.kind, source.read(), budget)
        for source, part in zip(sources, glanced)
    ]
    for part in parts:
        check_frames(part, limits.max_video_frames)
    _check_budget(parts, processor, budget)
    return parts
