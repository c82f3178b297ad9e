"""GSM8K from its original JSON-lines files (`question`, `answer` ending in `#### <number>`) to schema rows.

hyflow prepare-data gsm8k --input path/to/grade_school_math/data --output data/gsm8k
"""

from __future__ import annotations

import os
from typing import Any

from hyflow.data.preprocess.common import convert_raw_splits, make_row, require_field

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def extract_ground_truth(answer: str) -> str:
    """The number after the last `####` of a GSM8K answer, commas removed."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer has no '####' line: {answer[-80:]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


def to_row(record: dict[str, Any], split: str, index: int, source: str = "gsm8k") -> dict[str, Any]:
    """One raw GSM8K record as a schema row; `extra_info` is verl's: split, index, the raw answer, the question
    (in that order, so a file made here concatenates with one made by verl's `gsm8k.py`)."""
    question = require_field(record, "question", source, index)
    answer = require_field(record, "answer", source, index)
    return make_row(
        DATA_SOURCE,
        f"{question} {INSTRUCTION}",
        "math",
        extract_ground_truth(answer),
        split,
        index,
        answer=answer,
        question=question,
    )


def make_splits(input_path: str | os.PathLike, seed: int = 0, test_fraction: float = 0.1) -> dict[str, list[dict]]:
    """Rows of each split from a folder with the train/test files, or from one file split by `test_fraction`."""
    return convert_raw_splits(input_path, test_fraction, seed, to_row)
