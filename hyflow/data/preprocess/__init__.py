"""Preprocessing: turn raw datasets (local files) and synthetic tasks into rows of the verl parquet schema.

One module per task, each with `make_splits(...) -> {"train": rows, "test": rows}`; `hyflow prepare-data`
(`hyflow.data.prepare`) picks the module by name and writes `train.parquet` / `test.parquet`.

A row is `{"data_source", "prompt": [{"role", "content"}], "ability", "reward_model": {"style", "ground_truth"},
"extra_info": {"split", "index", ...}}`; see `hyflow.data.schema`.
"""

TASKS = ("gsm8k", "math", "arith", "countdown", "geo3k", "shapes", "reasoning_gym")
