"""The image part of a forward step's inputs: image embeddings at the pad tokens, and M-RoPE positions.

    embeds = step_embeddings(seqs, input_ids, model.model.embed_tokens, vision)   # None: no image token to fill
    rope = rope_positions(seqs, positions)      # (3, T) for an image prefill, (T,) shifted for a decode
    offsets = rope_offsets(seqs, device)        # (B,) per-sequence decode shift (mrope.py), None: all zero

A prefill feeds each sequence's uncached tokens, `token_ids[num_computed_tokens:]`; the pad tokens among them take
the rows of their image's vision-tower output (the image is encoded whole, once per step however many sequences
of the step hold it: the n samples of one prompt share it). Steps without images return None everywhere, so the
text path is untouched. Shapes: T new tokens of B sequences, E hidden size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hyflow.engine.models.vision import VisionTower
from hyflow.engine.sequence import Sequence


def _new_tokens(seqs: list[Sequence]) -> list[tuple[Sequence, int, int]]:
    """(sequence, start, offset of its first new token in the step) for each sequence of a step."""
    out, offset = [], 0
    for seq in seqs:
        out.append((seq, seq.num_computed_tokens, offset))
        offset += seq.num_tokens - seq.num_computed_tokens
    return out


def step_embeddings(
    seqs: list[Sequence],
    input_ids: torch.Tensor,
    embed_tokens: Callable[[torch.Tensor], torch.Tensor],
    vision: VisionTower | None,
) -> torch.Tensor | None:
    """Token embeddings (T, E) of a step with its image pad tokens replaced by their image's embeddings; None when
    no new token of the step is an image's."""
    images: dict[int, tuple[torch.Tensor, tuple[int, int, int]]] = {}
    targets: list[tuple[int, int, int, int]] = []  # (image hash, first row in the image, step index, count)
    for seq, start, offset in _new_tokens(seqs):
        if seq.images is None:
            continue
        view = seq.images
        for pixels, grid, key, (first, end) in zip(view.pixel_values, view.grids, view.hashes, view.spans):
            lo, hi = max(first, start), min(end, seq.num_tokens)
            if lo < hi:
                images[key] = (pixels, grid)
                targets.append((key, lo - first, offset + lo - start, hi - lo))
    if not targets:
        return None
    assert vision is not None, "a sequence with images reached a model without a vision tower"
    keys = list(images)
    grids = torch.tensor([images[key][1] for key in keys])
    features = vision.encode(torch.cat([images[key][0] for key in keys]), grids)
    rows_per_image = (grids.prod(-1) // vision.merge_size**2).tolist()
    by_image = dict(zip(keys, features.split(rows_per_image)))
    embeds = embed_tokens(input_ids).clone()
    for key, row, index, count in targets:
        embeds[index : index + count] = by_image[key][row : row + count].to(embeds.dtype)
    return embeds


def rope_positions(seqs: list[Sequence], positions: torch.Tensor) -> torch.Tensor:
    """The positions the rotary embedding reads in a step: `positions` (T,) itself without image sequences; with
    them, (3, T) M-RoPE rows for a prefill (text sequences repeat their positions on the three rows) or, for a decode
    (every new token a generated one), (T,) shifted by each sequence's decode offset."""
    if all(seq.images is None for seq in seqs):
        return positions
    if all(seq.num_computed_tokens >= seq.num_prompt_tokens for seq in seqs):  # a decode: generated tokens only
        return positions + rope_offsets(seqs, positions.device)
    rows = []
    for seq, start, _ in _new_tokens(seqs):
        if seq.images is None:
            rows.append(torch.arange(start, seq.num_tokens).expand(3, -1))
        else:
            rows.append(seq.images.rope_positions(start, seq.num_tokens))
    return torch.cat(rows, dim=1).to(positions.device)


def rope_offsets(seqs: list[Sequence], device: torch.device) -> torch.Tensor | None:
    """Per sequence, its decode positions' shift (mrope.py's delta, 0 for text), or None when all are 0."""
    if all(seq.images is None for seq in seqs):
        return None
    deltas = [0 if seq.images is None else seq.images.delta for seq in seqs]
    return torch.tensor(deltas, dtype=torch.long).to(device, non_blocking=True)
