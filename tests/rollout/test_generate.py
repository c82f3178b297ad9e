"""`hyflow generate` writes n responses per chat prompt of a parquet file."""

from __future__ import annotations

import pandas as pd

from hyflow.cli import main as cli_main
from hyflow.models.tiny import build_tiny_model


def test_generate_command_adds_n_responses_per_row(tmp_path):
    model = build_tiny_model(tmp_path / "model", arch="qwen2", max_position_embeddings=128)
    rows = [
        {"prompt": [{"role": "user", "content": "1+2="}], "data_source": "arith"},
        {"prompt": [{"role": "user", "content": "3+4="}], "data_source": "arith"},
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "in.parquet")
    argv = [
        "generate",
        "--model",
        model,
        "--input",
        str(tmp_path / "in.parquet"),
        "--output",
        str(tmp_path / "out.parquet"),
        "--n",
        "2",
        "--max-tokens",
        "4",
    ]
    assert cli_main(argv) == 0
    out = pd.read_parquet(tmp_path / "out.parquet")
    assert list(out["data_source"]) == ["arith", "arith"]
    assert [len(responses) for responses in out["responses"]] == [2, 2]
    assert all(isinstance(text, str) for responses in out["responses"] for text in responses)
