"""MATH (Hendrycks et al.) from its original files (`problem`, `solution` with a final `\\boxed{}`) to schema rows.

The original release is one JSON file per problem under `train/<subject>/` and `test/<subject>/`; JSON-lines or
parquet copies with the same fields work too.

    hyflow prepare-data math --input path/to/MATH --output data/math
"""

from __future__ import annotations

import os
from typing import Any

from hyflow.data.preprocess.common import convert_raw_splits, make_row, require_field
from hyflow.reward.scorers.math import last_boxed_only_string, remove_boxed

DATA_SOURCE = "lighteval/MATH"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def to_row(record: dict[str, Any], split: str, index: int, source: str = "math") -> dict[str, Any] | None:
    """One raw MATH record as a schema row, or None when its solution has no `\\boxed{}` answer.

    The ground truth is the boxed answer as verl extracts it; `extra_info` has verl's fields only (`split`,
    `index`), so a file made here concatenates with one made by verl's `math_dataset.py`.
    """
    problem = require_field(record, "problem", source, index)
    solution = require_field(record, "solution", source, index)
    boxed = last_boxed_only_string(solution)
    try:
        answer = None if boxed is None else remove_boxed(boxed)
    except ValueError:  # an `\fbox{}` answer, which verl's extraction cannot read either
        answer = None
    if answer is None:
        return None
    return make_row(DATA_SOURCE, f"{problem} {INSTRUCTION}", "math", answer, split, index)


def make_splits(input_path: str | os.PathLike, seed: int = 0, test_fraction: float = 0.1) -> dict[str, list[dict]]:
    """Rows of each split; problems whose solution has no `\\boxed{}` answer are skipped (and counted)."""
    return convert_raw_splits(input_path, test_fraction, seed, to_row, skipped="problems without a boxed answer")
