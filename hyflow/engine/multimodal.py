"""The images and videos of one prompt as the engine keeps them: each one's patches, its pad-token span, its hash,
and the prompt's M-RoPE positions.

    spec = VisionSpec(image_token_id=151655, merge_size=2, video_token_id=151656, tokens_per_second=2)
    images = prompt_images(prompt_ids, {"pixel_values": pv, "image_grid_thw": grid}, spec, request_id="r0")
    engine.add_request(prompt_ids, params, multi_modal_inputs={"pixel_values": pv, "image_grid_thw": grid})

The inputs are the model's processor outputs for the prompt (what `hyflow.data` keeps per row as
`multi_modal_inputs`): `pixel_values` (N, C*T*P*P), the patches of all images one after the other, and
`image_grid_thw` (K, 3), each image's patch grid; for videos `pixel_values_videos` and `video_grid_thw` alike, and
for Qwen2.5-VL `second_per_grid_ts` (num_videos,), the seconds one temporal patch spans, which spaces the video's
temporal positions (mrope.py). The prompt holds each image's (video's) pad tokens already expanded (the processor
does it), t*h*w / m^2 of them for item k, m the merge size. A video is encoded like an image with t > 1 temporal
patches: the vision tower takes both alike.

Prefix sharing keys every cache block by its token ids plus the hashes of the images and videos whose pad tokens
it holds (`hashes_between`): the pad token is the same id for every image, so without the hash two prompts that
differ only in their pictures would share K/V. The hash covers the item's patches, grid and temporal step, so the
n samples of one prompt (and later prompts with the same image) share.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from hyflow.engine.models.mrope import mrope_positions, video_time_steps

IMAGE_KEYS = ("pixel_values", "image_grid_thw")
VIDEO_KEYS = ("pixel_values_videos", "video_grid_thw")


@dataclass(frozen=True)
class VisionSpec:
    """What the engine reads of a VLM's config to place its images and videos: the pad token ids, the merge size,
    and Qwen2.5-VL's `vision_config.tokens_per_second` (None: video positions count temporal patches, Qwen2-VL)."""

    image_token_id: int
    merge_size: int
    video_token_id: int | None = None
    tokens_per_second: float | None = None

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> VisionSpec:
        vision = hf_config.vision_config
        return cls(
            image_token_id=hf_config.image_token_id,
            merge_size=vision.spatial_merge_size,
            video_token_id=getattr(hf_config, "video_token_id", None),
            tokens_per_second=getattr(vision, "tokens_per_second", None),
        )


def image_hash(pixels: torch.Tensor, grid: tuple[int, int, int], time_step: float = 1.0) -> int:
    """A 64-bit hash of one image's (or video's) patches (their bytes), grid and temporal position step."""
    digest = hashlib.blake2b(repr((grid, time_step)).encode(), digest_size=8)
    digest.update(pixels.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return int.from_bytes(digest.digest(), "little")


@dataclass
class PromptImages:
    """One prompt's images and videos, in prompt order: per item k its patches, grid, hash and pad-token span
    [start, end); the prompt's M-RoPE positions (3, P) and the decode offset (mrope.py)."""

    pixel_values: list[torch.Tensor]
    grids: list[tuple[int, int, int]]
    hashes: list[int]
    spans: list[tuple[int, int]]
    positions: torch.Tensor
    delta: int

    def rope_positions(self, start: int, end: int) -> torch.Tensor:
        """The M-RoPE positions (3, end - start) of tokens start..end-1 of the sequence (prompt and generated)."""
        prompt_len = self.positions.shape[1]
        inside = self.positions[:, start : min(end, prompt_len)]
        if end <= prompt_len:
            return inside
        after = torch.arange(max(start, prompt_len), end) + self.delta
        return torch.cat([inside, after.expand(3, -1)], dim=1)

    def hashes_between(self, start: int, end: int) -> tuple[int, ...]:
        """The hashes of the images and videos with pad tokens among tokens start..end-1."""
        return tuple(h for h, (s, e) in zip(self.hashes, self.spans) if s < end and e > start)


def _pad_spans(prompt: list[int], counts: list[int], pad_id: int) -> list[tuple[int, int]]:
    """[start, end) of each item's pad tokens: item k takes the next counts[k] pads (a run may hold several)."""
    pads = [i for i, token in enumerate(prompt) if token == pad_id]
    spans, taken = [], 0
    for count in counts:
        spans.append((pads[taken], pads[taken + count - 1] + 1))
        taken += count
    return spans


@dataclass
class _Items:
    """The images (or the videos) of one prompt, checked against it."""

    pad_id: int
    pixel_values: list[torch.Tensor]
    grids: list[tuple[int, int, int]]
    time_steps: list[float]
    spans: list[tuple[int, int]]


def _items(
    prompt: list[int],
    inputs: dict[str, Any],
    keys: tuple[str, str],
    pad_id: int,
    spec: VisionSpec,
    request_id: str,
    time_steps: list[float] | None = None,
) -> _Items:
    """One kind's items; ValueError naming the request when they do not match the prompt."""
    kind = "image" if keys == IMAGE_KEYS else "video"
    pixel_key, grid_key = keys
    pixel_values, grid_thw = inputs[pixel_key], torch.as_tensor(inputs[grid_key]).view(-1, 3)
    grids = [(int(t), int(h), int(w)) for t, h, w in grid_thw.tolist()]
    patch_counts = [t * h * w for t, h, w in grids]
    if sum(patch_counts) != pixel_values.shape[0]:
        raise ValueError(
            f"request {request_id!r}: {pixel_key} has {pixel_values.shape[0]} patches but {grid_key} {grids} makes "
            f"{sum(patch_counts)}; pass the processor's outputs for this prompt unchanged"
        )
    token_counts = [n // spec.merge_size**2 for n in patch_counts]
    num_pads = sum(1 for token in prompt if token == pad_id)
    if num_pads != sum(token_counts):
        raise ValueError(
            f"request {request_id!r}: the prompt has {num_pads} {kind} pad tokens (id {pad_id}) but its "
            f"{len(grids)} {kind}(s) need {sum(token_counts)} ({token_counts}); tokenize the prompt with the "
            f"model's processor, which expands each {kind}'s pad token"
        )
    steps = time_steps if time_steps is not None else [1.0] * len(grids)
    spans = _pad_spans(prompt, token_counts, pad_id)
    return _Items(pad_id, list(pixel_values.split(patch_counts)), grids, steps, spans)


def _video_time_steps(inputs: dict[str, Any], spec: VisionSpec, request_id: str) -> list[float] | None:
    """`mrope.video_time_steps` of the request's videos; ValueError when `second_per_grid_ts` has not one entry
    per video."""
    num_videos = torch.as_tensor(inputs["video_grid_thw"]).view(-1, 3).shape[0]
    seconds = inputs.get("second_per_grid_ts")
    if seconds is not None and torch.as_tensor(seconds).numel() != num_videos:
        raise ValueError(
            f"request {request_id!r}: second_per_grid_ts has {torch.as_tensor(seconds).numel()} entries for "
            f"{num_videos} video(s); pass one per video (the processor's output)"
        )
    return video_time_steps(spec.tokens_per_second, seconds, num_videos)


def prompt_images(prompt: list[int], inputs: dict[str, Any], spec: VisionSpec, request_id: str) -> PromptImages:
    """The engine's view of a prompt's processor outputs (images, videos or both); ValueError naming the request
    when they do not match the prompt (pad tokens vs the items' token counts, patches vs the grids)."""
    kinds = []
    for keys, pad_id in ((IMAGE_KEYS, spec.image_token_id), (VIDEO_KEYS, spec.video_token_id)):
        present = [key for key in keys if inputs.get(key) is not None]
        if not present:
            continue
        if len(present) < 2 or pad_id is None:
            lacking = [key for key in keys if key not in present] or ["video_token_id in the model config"]
            raise ValueError(
                f"request {request_id!r}: multi_modal_inputs lacks {lacking} (has {sorted(inputs)}); pass the "
                f"processor's outputs for the prompt: {' and '.join(keys)}"
            )
        steps = _video_time_steps(inputs, spec, request_id) if keys == VIDEO_KEYS else None
        kinds.append(_items(prompt, inputs, keys, pad_id, spec, request_id, steps))
    if not kinds:
        raise ValueError(
            f"request {request_id!r}: multi_modal_inputs has {sorted(inputs)}, no images or videos; pass the "
            "processor's outputs for the prompt: pixel_values and image_grid_thw (pixel_values_videos and "
            "video_grid_thw for videos)"
        )
    grids = {items.pad_id: items.grids for items in kinds}
    positions, delta = mrope_positions(prompt, grids, spec.merge_size, {k.pad_id: k.time_steps for k in kinds})
    order = sorted(
        ((span, pixels, grid, step) for k in kinds for span, pixels, grid, step in
         zip(k.spans, k.pixel_values, k.grids, k.time_steps)),
        key=lambda item: item[0],
    )  # fmt: skip
    return PromptImages(
        pixel_values=[pixels for _, pixels, _, _ in order],
        grids=[grid for _, _, grid, _ in order],
        hashes=[image_hash(pixels, grid, step) for _, pixels, grid, step in order],
        spans=[span for span, _, _, _ in order],
        positions=positions,
        delta=delta,
    )
