"""The synthetic visual `shapes` task: small Pillow pictures of coloured shapes, with an exact answer.

    hyflow prepare-data shapes --output data/shapes --question color --image-size 56

Each row holds one PNG (verl's `images` column: `[{"bytes": ..., "path": None}]`) and a prompt with one `<image>`
placeholder. `--question count` asks how many shapes there are (1 to `max_count`); `--question color` asks for
the colour all the shapes share (one of `COLORS`). Prompts read `<image>How many shapes are in the picture? Put
the answer in <answer></answer>.`; the ground truth is the answer string (`"3"`, `"red"`), scored exactly.
The pictures are drawn by seed, so the same arguments always give the same rows.
"""

from __future__ import annotations

import io
import random
from typing import Any, Literal

from PIL import Image, ImageDraw

from hyflow.data.preprocess.common import make_row, seeded_splits

DATA_SOURCE = "hyflow/shapes"
INSTRUCTION = "Put the answer in <answer></answer>."
COLORS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220)}
QUESTIONS = {
    "count": "How many shapes are in the picture?",
    "color": "What color are the shapes in the picture?",
}
Question = Literal["count", "color"]
CELL = 28  # pixels per grid cell: one merged 28x28 patch, i.e. one image token of Qwen2-VL


def draw_shapes(rng: random.Random, count: int, color: tuple[int, int, int], image_size: int) -> bytes:
    """PNG bytes of `count` non-overlapping squares and circles of one colour on white, at random places."""
    image = Image.new("RGB", (image_size, image_size), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    cells = image_size // CELL  # one shape per cell at most, one cell per image token of the language model
    for cell in rng.sample(range(cells * cells), count):
        x, y = (cell % cells) * CELL + 3, (cell // cells) * CELL + 3
        box = (x, y, x + CELL - 7, y + CELL - 7)
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=color)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def make_rows(
    num_rows: int,
    seed: int,
    split: str = "train",
    question: Question = "count",
    max_count: int = 4,
    image_size: int = 56,
    instruction: str = INSTRUCTION,
) -> list[dict[str, Any]]:
    """`num_rows` schema rows with one picture each; the same arguments always give the same rows."""
    if question not in QUESTIONS:
        raise ValueError(f"shapes: question={question!r} is not a question; use one of {list(QUESTIONS)}.")
    if image_size < 28 or image_size % 28:
        raise ValueError(f"shapes: image_size={image_size} must be a multiple of 28 (one image token per 28x28).")
    if not 1 <= max_count <= (image_size // CELL) ** 2:
        raise ValueError(f"shapes: max_count={max_count} must be between 1 and {(image_size // CELL) ** 2}.")
    rng = random.Random(seed)
    rows = []
    for index in range(num_rows):
        count, color_name = rng.randint(1, max_count), rng.choice(sorted(COLORS))
        png = draw_shapes(rng, count, COLORS[color_name], image_size)
        answer = str(count) if question == "count" else color_name
        content = f"<image>{QUESTIONS[question]} {instruction}".strip()
        row = make_row(DATA_SOURCE, content, "vision", answer, split, index, answer=f"<answer>{answer}</answer>")
        row["images"] = [{"bytes": png, "path": None}]
        rows.append(row)
    return rows


def make_splits(
    train_size: int = 1000, test_size: int = 100, seed: int = 0, **options: Any
) -> dict[str, list[dict[str, Any]]]:
    """Train and test rows from two different seeds (`seed` and `seed + 1`); `options` go to `make_rows`."""
    return seeded_splits(make_rows, train_size, test_size, seed, **options)
