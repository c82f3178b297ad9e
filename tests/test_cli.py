"""The `hyflow` command: its usage, unknown commands, and a user's mistake as one line instead of a traceback."""

from __future__ import annotations

import pytest

from hyflow import cli


def test_usage_lists_every_command(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name}" in out for name in cli.COMMANDS)


def test_an_unknown_command_exits_2_with_the_usage(capsys):
    assert cli.main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_a_bad_input_file_is_one_line_naming_the_command(tmp_path, capsys):
    missing = tmp_path / "none.parquet"
    argv = ["generate", "--model", str(tmp_path), "--input", str(missing), "--output", str(tmp_path / "o.parquet")]
    assert cli.main(argv) == cli.EXIT_USER_ERROR
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("hyflow generate: --input") and "does not exist" in line


def test_hyflow_traceback_shows_the_traceback_instead(tmp_path, monkeypatch):
    monkeypatch.setenv("HYFLOW_TRACEBACK", "1")
    argv = ["generate", "--model", str(tmp_path), "--input", str(tmp_path / "x"), "--output", str(tmp_path / "o")]
    with pytest.raises(FileNotFoundError, match="--input"):
        cli.main(argv)
