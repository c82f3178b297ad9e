"""The images of one prompt as the engine keeps them: each image's patches, its pad-token span, its hash, and the
prompt's M-RoPE positions.

    images = prompt_images(prompt_ids, {"pixel_values": pv, "image_grid_thw": grid}, image_token_id=151655,
                           merge_size=2, request_id="r0")
    engine.add_request(prompt_ids, params, multi_modal_inputs={"pixel_values": pv, "image_grid_thw": grid})

The inputs are the model's processor outputs for the prompt (what `hyflow.data` keeps per row as
`multi_modal_inputs`): `pixel_values` (N, C*T*P*P), the patches of all images one after the other, and
`image_grid_thw` (K, 3), each image's patch grid. The prompt holds each image's pad tokens already expanded (the
processor does it), t*h*w / m^2 of them for image k, m the merge size.

Prefix sharing keys every cache block by its token ids plus the hashes of the images whose pad tokens it holds
(`hashes_between`): the pad token is the same id for every image, so without the hash two prompts that differ only
in their pictures would share K/V. The hash covers the image's patches and grid, so the n samples of one prompt
(and later prompts with the same image) share.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from hyflow.engine.models.mrope import mrope_positions

MULTI_MODAL_KEYS = ("pixel_values", "image_grid_thw")


def image_hash(pixels: torch.Tensor, grid: tuple[int, int, int]) -> int:
    """A 64-bit hash of one image's patches (their bytes) and grid."""
    digest = hashlib.blake2b(repr(grid).encode(), digest_size=8)
    digest.update(pixels.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return int.from_bytes(digest.digest(), "little")


@dataclass
class PromptImages:
    """One prompt's images: per image k its patches, grid, hash and pad-token span [start, end); the prompt's
    M-RoPE positions (3, P) and the decode offset (mrope.py)."""

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
        """The hashes of the images with pad tokens among tokens start..end-1."""
        return tuple(h for h, (s, e) in zip(self.hashes, self.spans) if s < end and e > start)


def _image_spans(prompt: list[int], counts: list[int], image_token_id: int) -> list[tuple[int, int]]:
    """[start, end) of each image's pad tokens: image k takes the next counts[k] pads (a run may hold several)."""
    pads = [i for i, token in enumerate(prompt) if token == image_token_id]
    spans, taken = [], 0
    for count in counts:
        spans.append((pads[taken], pads[taken + count - 1] + 1))
        taken += count
    return spans


def prompt_images(
    prompt: list[int], inputs: dict[str, Any], image_token_id: int, merge_size: int, request_id: str
) -> PromptImages:
    """The engine's view of a prompt's processor outputs; ValueError naming the request when they do not match
    the prompt (pad tokens vs the images' token counts, patches vs the grids)."""
    missing = [key for key in MULTI_MODAL_KEYS if inputs.get(key) is None]
    if missing:
        raise ValueError(
            f"request {request_id!r}: multi_modal_inputs lacks {missing} (has {sorted(inputs)}); pass the "
            "processor's outputs for the prompt: pixel_values and image_grid_thw (videos are not supported)"
        )
    pixel_values, grid_thw = inputs["pixel_values"], torch.as_tensor(inputs["image_grid_thw"]).view(-1, 3)
    grids = [(int(t), int(h), int(w)) for t, h, w in grid_thw.tolist()]
    patch_counts = [t * h * w for t, h, w in grids]
    if sum(patch_counts) != pixel_values.shape[0]:
        raise ValueError(
            f"request {request_id!r}: pixel_values has {pixel_values.shape[0]} patches but image_grid_thw "
            f"{grids} makes {sum(patch_counts)}; pass the processor's outputs for this prompt unchanged"
        )
    token_counts = [n // merge_size**2 for n in patch_counts]
    num_pads = sum(1 for token in prompt if token == image_token_id)
    if num_pads != sum(token_counts):
        raise ValueError(
            f"request {request_id!r}: the prompt has {num_pads} image pad tokens (id {image_token_id}) but its "
            f"{len(grids)} image(s) need {sum(token_counts)} ({token_counts}); tokenize the prompt with the "
            "model's processor, which expands each image's pad token"
        )
    positions, delta = mrope_positions(prompt, grids, image_token_id, merge_size)
    return PromptImages(
        pixel_values=list(pixel_values.split(patch_counts)),
        grids=grids,
        hashes=[image_hash(p, g) for p, g in zip(pixel_values.split(patch_counts), grids)],
        spans=_image_spans(prompt, token_counts, image_token_id),
        positions=positions,
        delta=delta,
    )
