"""`hyflow generate` writes n responses per chat prompt of a parquet file."""

from __future__ import annotations

import pandas as pd

from hyflow.cli import main as cli_main
from hyflow.models.tiny import build_tiny_model
from hyflow.rollout import generate


def test_generate_command_adds_n_responses_per_row(tmp_path, capsys):
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
    assert "generating: 100%" in capsys.readouterr().err  # the progress bar


def test_a_bad_output_path_is_one_line_before_any_model_loads(tmp_path, monkeypatch, capsys):
    def engine_must_not_start(*args, **kwargs):
        raise AssertionError("the engine started before the output path was checked")

    monkeypatch.setattr(generate, "LLMEngine", engine_must_not_start)
    pd.DataFrame({"prompt": [[{"role": "user", "content": "1+2="}]]}).to_parquet(tmp_path / "in.parquet")
    (tmp_path / "taken").mkdir()
    argv = ["generate", "--model", str(tmp_path), "--input", str(tmp_path / "in.parquet")]

    assert cli_main([*argv, "--output", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hyflow generate: --output") and "is a folder" in err and len(err.splitlines()) == 1


def test_generate_help_gives_every_option_with_its_default():
    options = generate.parser()
    listed = " ".join(options.format_help().split()).split("options:")[1]  # after the usage line
    optional = [action for action in options._actions if not action.required and action.dest != "help"]
    assert len(optional) == 9
    for action in optional:
        entry = listed.split(f"{action.option_strings[0]} {action.dest.upper()} ", 1)[1].split(" --")[0]
        assert entry.endswith(f"(default: {action.default})"), entry
