"""Geometry3K (geometry problems with a figure) from its original parquet files to multimodal schema rows.

    hyflow prepare-data geo3k --input path/to/geometry3k --output data/geo3k

The input holds the original `train` / `test` files (columns `images`: a list of `{"bytes", "path"}`, `problem`:
text that starts with `<image>`, `answer`). Rows follow verl's geo3k preprocessing: the problem plus
`INSTRUCTION` as the user message, the images column kept as it is, data source `hiyouga/geometry3k`.
"""

from __future__ import annotations

import os
from typing import Any

from hyflow.data.preprocess.common import convert_raw_splits, make_row, require_field

DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = (
    "You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    "The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put in \\boxed{}."
)


def to_row(record: dict[str, Any], split: str, index: int, source: str = "geo3k") -> dict[str, Any]:
    """One raw Geometry3K record as a schema row with its images; the raw problem and answer go to extra_info."""
    problem = require_field(record, "problem", source, index)
    answer = require_field(record, "answer", source, index)
    images = require_field(record, "images", source, index)
    row = make_row(
        DATA_SOURCE, f"{problem} {INSTRUCTION}", "math", answer, split, index, answer=answer, question=problem
    )
    row["images"] = list(images)
    return row


def make_splits(input_path: str | os.PathLike, seed: int = 0, test_fraction: float = 0.1) -> dict[str, list[dict]]:
    """Rows of each split from a folder with the train/test files, or from one file split by `test_fraction`."""
    return convert_raw_splits(input_path, test_fraction, seed, to_row)
