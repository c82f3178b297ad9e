"""`hyflow prepare-data`: write `train.parquet` and `test.parquet` in the verl schema for one task.

    hyflow prepare-data gsm8k --input path/to/gsm8k --output data/gsm8k          # original jsonl files
    hyflow prepare-data math --input path/to/MATH --output data/math             # original json files
    hyflow prepare-data arith --output data/arith --num-digits 3 --num-operands 2
    hyflow prepare-data countdown --output data/countdown --num-numbers 4
    hyflow prepare-data geo3k --input path/to/geometry3k --output data/geo3k     # original parquet files
    hyflow prepare-data shapes --output data/shapes --question count              # pictures drawn by seed
    hyflow prepare-data reasoning_gym --task basic_arithmetic --size 500 --output data/rg   # pip install hyflow[envs]

The synthetic tasks need no input. In Python: `prepare_task("arith", "data/arith", train_size=200)`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
from pathlib import Path
from typing import Any

from hyflow.data.preprocess import TASKS

logger = logging.getLogger(__name__)

# The synthetic tasks and the options of each (the same names as the command-line flags, with `_`).
_SYNTHETIC_OPTIONS = {
    "arith": ("train_size", "test_size", "num_digits", "num_operands", "operators", "allow_negative"),
    "countdown": ("train_size", "test_size", "num_numbers", "max_number"),
    "shapes": ("train_size", "test_size", "question", "max_count", "image_size"),
    "reasoning_gym": ("tasks", "train_size", "test_size", "config", "system_prompt"),
}
# Where the raw files of each task with an input come from, with today's tools: `hf` is huggingface_hub's command
# (`pip install -U huggingface_hub`; it replaced `huggingface-cli`); the files it fetches are the ones
# `hyflow prepare-data` reads (parquet files whose names contain train / test).
DOWNLOADS = {
    "gsm8k": "hf download openai/gsm8k --repo-type dataset --include 'main/*' --local-dir ~/data/gsm8k",
    "math": "hf download EleutherAI/hendrycks_math --repo-type dataset --local-dir ~/data/MATH",
    "geo3k": "hf download hiyouga/geometry3k --repo-type dataset --local-dir ~/data/geometry3k",
}


def missing_input_error(task: str, input_path: str | os.PathLike | None) -> ValueError:
    """The error for a task whose raw files are not at `input_path` (None: not given), saying how to get them."""
    problem = "--input is required" if input_path is None else f"--input {str(input_path)!r} does not exist"
    where = f" Get them with `{DOWNLOADS[task]}`, then pass that folder as --input." if task in DOWNLOADS else ""
    return ValueError(f"prepare-data {task}: {problem} (the file or folder with the raw data).{where}")


def write_parquet(rows: list[dict[str, Any]], path: str | os.PathLike) -> None:
    """Write schema rows to one parquet file (nested columns become parquet structs and lists)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise ValueError(f"No rows to write to {str(path)!r}; the input gave an empty split.")
    pq.write_table(pa.Table.from_pylist(rows), path)


def prepare_task(
    task: str,
    output_dir: str | os.PathLike,
    input_path: str | os.PathLike | None = None,
    seed: int = 0,
    **options: Any,
) -> dict[str, str]:
    """Build the task's splits and write `<output_dir>/<split>.parquet`; return {split: path}.

    gsm8k / math / geo3k read `input_path` (options: `test_fraction`); arith / countdown / shapes are generated
    by `seed` (options: `train_size`, `test_size` and the task's difficulty settings).
    """
    if task not in TASKS:
        raise ValueError(f"prepare-data: task={task!r} is not known; choose one of {list(TASKS)}.")
    module = importlib.import_module(f"hyflow.data.preprocess.{task}")
    if task in _SYNTHETIC_OPTIONS:
        splits = module.make_splits(seed=seed, **options)
    else:
        if input_path is None or not Path(input_path).exists():
            raise missing_input_error(task, input_path)
        splits = module.make_splits(input_path, seed=seed, **options)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    written = {}
    for split, rows in splits.items():
        path = os.path.join(output_dir, f"{split}.parquet")
        write_parquet(rows, path)
        written[split] = path
        logger.info("%s: wrote %d rows to %s", task, len(rows), path)
    return written


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hyflow prepare-data", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("task", choices=TASKS)
    parser.add_argument("--input", default=None, help="gsm8k/math/geo3k: a raw file, or a folder with train/test")
    parser.add_argument("--output", required=True, help="folder for train.parquet and test.parquet")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--test-fraction", type=float, default=0.1, help="gsm8k/math with one input file")
    synthetic = parser.add_argument_group("synthetic tasks (arith, countdown, shapes)")
    synthetic.add_argument("--train-size", type=int, default=1000)
    synthetic.add_argument("--test-size", type=int, default=100)
    synthetic.add_argument("--num-digits", type=int, default=2, help="arith: digits per operand")
    synthetic.add_argument("--num-operands", type=int, default=2, help="arith")
    synthetic.add_argument("--operators", default="+-", help="arith: a string of + - *")
    synthetic.add_argument("--allow-negative", action="store_true", help="arith: keep problems with negative results")
    synthetic.add_argument("--num-numbers", type=int, default=3, help="countdown")
    synthetic.add_argument("--max-number", type=int, default=9, help="countdown")
    synthetic.add_argument("--question", choices=("count", "color"), default="count", help="shapes")
    synthetic.add_argument("--max-count", type=int, default=4, help="shapes: most shapes in a picture")
    synthetic.add_argument("--image-size", type=int, default=56, help="shapes: picture side in pixels (28k)")
    rgym = parser.add_argument_group("reasoning_gym (pip install 'hyflow[envs]')")
    rgym.add_argument("--task", dest="tasks", default="", help="reasoning_gym: task name(s), comma-separated")
    rgym.add_argument("--size", type=int, default=None, help="reasoning_gym: train entries per task (--train-size)")
    rgym.add_argument("--config", default=None, help="reasoning_gym: the task's config as JSON")
    rgym.add_argument("--system-prompt", default="default", help="reasoning_gym: a SYSTEM_PROMPTS name, or none")
    return parser


def _task_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.task in _SYNTHETIC_OPTIONS:
        return {name: getattr(args, name) for name in _SYNTHETIC_OPTIONS[args.task]}
    return {"test_fraction": args.test_fraction}


def main(argv: list[str]) -> int:
    """Entry point of `hyflow prepare-data`."""
    args = _parser().parse_args(argv)
    if args.size is not None:
        args.train_size = args.size
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        prepare_task(args.task, args.output, args.input, seed=args.seed, **_task_options(args))
    except (ValueError, ImportError) as exc:
        logger.error("prepare-data: %s", exc)
        return 2
    return 0
