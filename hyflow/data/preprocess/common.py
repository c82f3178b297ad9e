"""Helpers shared by the preprocessors: reading raw files in their original formats, building schema rows, and
turning them into train/test splits (raw datasets: `convert_raw_splits`; synthetic tasks: `seeded_splits`)."""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RAW_SUFFIXES = (".jsonl", ".json", ".parquet")


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of one raw file: JSON lines, a JSON object or list of objects, or parquet."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if path.suffix == ".json":
        loaded = json.loads(text)
        return loaded if isinstance(loaded, list) else [loaded]
    raise ValueError(f"Cannot read {str(path)!r}: the file type must be one of {list(RAW_SUFFIXES)}.")


def _files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in RAW_SUFFIXES)


def find_split_files(root: str | os.PathLike) -> dict[str, list[Path]]:
    """The raw files of each split under a folder: a `train/` / `test/` subfolder, or files named `*train*` /
    `*test*`. A single file is returned as `{"all": [file]}` for the caller to split."""
    root = Path(root)
    if not root.exists():
        raise ValueError(f"--input {str(root)!r} does not exist; pass the file or folder holding the raw data.")
    if root.is_file():
        return {"all": [root]}
    splits: dict[str, list[Path]] = {}
    for split in ("train", "test"):
        if (root / split).is_dir():
            splits[split] = _files_under(root / split)
        else:
            splits[split] = [p for p in _files_under(root) if split in p.name.lower()]
    missing = [split for split, files in splits.items() if not files]
    if missing:
        raise ValueError(
            f"--input {str(root)!r}: found no {' or '.join(missing)} files. Put the original files there as "
            f"train/ and test/ subfolders or as files whose names contain 'train' / 'test' ({list(RAW_SUFFIXES)})."
        )
    return splits


def split_records(records: list[dict], test_fraction: float, seed: int) -> dict[str, list[dict]]:
    """Shuffle by seed and cut off `test_fraction` of the records as the test split (at least one row each)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction} must be between 0 and 1 (exclusive), e.g. 0.1.")
    if len(records) < 2:
        raise ValueError(f"Need at least 2 records to make a train and a test split, got {len(records)}.")
    shuffled = list(records)
    random.Random(seed).shuffle(shuffled)
    num_test = min(len(shuffled) - 1, max(1, round(len(shuffled) * test_fraction)))
    return {"train": shuffled[num_test:], "test": shuffled[:num_test]}


def load_raw_splits(path: str | os.PathLike, test_fraction: float, seed: int) -> dict[str, list[dict]]:
    """Records per split from a folder of original files, or from one file split by `test_fraction`."""
    files = find_split_files(path)
    records = {split: [r for f in paths for r in read_records(f)] for split, paths in files.items()}
    if "all" in records:
        logger.info("one input file: splitting %d records with test_fraction=%s", len(records["all"]), test_fraction)
        return split_records(records["all"], test_fraction, seed)
    return records


def make_row(
    data_source: str, content: str, ability: str, ground_truth: Any, split: str, index: int, **extra: Any
) -> dict[str, Any]:
    """One row of the verl schema with a single user message."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, **extra},
    }


def require_field(record: dict, key: str, source: str, index: int) -> Any:
    """`record[key]`, or a ValueError naming the record and the field."""
    if key not in record:
        raise ValueError(
            f"{source}: record {index} has no {key!r} field (it has {sorted(record)}); "
            "is this the original dataset format?"
        )
    return record[key]


def convert_raw_splits(
    input_path: str | os.PathLike,
    test_fraction: float,
    seed: int,
    to_row: Callable[[dict[str, Any], str, int, str], dict[str, Any] | None],
    skipped: str = "records",
) -> dict[str, list[dict[str, Any]]]:
    """Rows of each split of a raw dataset (`load_raw_splits`), one `to_row(record, split, index, source)` per record.

    A record for which `to_row` returns None is left out and counted in a warning that reads `skipped <n> <skipped>`.
    """
    splits: dict[str, list[dict[str, Any]]] = {}
    for split, records in load_raw_splits(input_path, test_fraction, seed).items():
        rows = [to_row(record, split, index, f"{input_path} ({split})") for index, record in enumerate(records)]
        splits[split] = [row for row in rows if row is not None]
        if len(splits[split]) < len(rows):
            logger.warning("%s: skipped %d %s", f"{input_path} ({split})", len(rows) - len(splits[split]), skipped)
    return splits


def seeded_splits(
    make_rows: Callable[..., list[dict[str, Any]]], train_size: int, test_size: int, seed: int, **difficulty: Any
) -> dict[str, list[dict[str, Any]]]:
    """Train and test rows of a synthetic task from two different seeds (`seed` and `seed + 1`), so they differ;
    `make_rows(num_rows, seed, split, **difficulty)` builds each."""
    return {
        "train": make_rows(train_size, seed, "train", **difficulty),
        "test": make_rows(test_size, seed + 1, "test", **difficulty),
    }
