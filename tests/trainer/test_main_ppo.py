"""The command-line entry: `python -m hyflow.trainer.main_ppo` and `hyflow train` (in process, no training)."""

from __future__ import annotations

import logging
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

from hyflow import cli
from hyflow.data.prepare import prepare_task
from hyflow.models.tiny import build_tiny_model
from hyflow.trainer import main_ppo


def _model_folder(path: Path) -> Path:
    """Enough of a Hugging Face folder for the config checks (they look for config.json, nothing more)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def launch(tmp_path, monkeypatch) -> list[str]:
    """README's Training command, with `~` paths, on a home folder of the test's own (and cwd elsewhere)."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    prepare_task("arith", home / "data" / "gsm8k-rl", seed=0, train_size=16, test_size=4, num_digits=1)
    _model_folder(home / "models" / "qwen")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return [
        "data.train_files=~/data/gsm8k-rl/train.parquet",
        "data.val_files=~/data/gsm8k-rl/test.parquet",
        "data.train_batch_size=8",
        "actor_rollout_ref.model.path=~/models/qwen",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=8",
        "trainer.backend=local",
    ]


def test_readmes_training_command_with_tilde_paths_loads_with_the_home_folder_expanded(launch, capsys, tmp_path):
    code = main_ppo.main(["--cfg", "job", *launch, "trainer.default_local_dir=~/ckpt"])

    out = capsys.readouterr().out
    assert code == 0
    home = tmp_path / "home"
    assert f"train_files: {home}/data/gsm8k-rl/train.parquet" in out
    assert f"path: {home}/models/qwen" in out
    assert f"default_local_dir: {home}/ckpt" in out
    assert "~" not in out


def test_cfg_job_prints_the_names_the_run_uses_and_writes_nothing(launch, capsys, caplog):
    with caplog.at_level(logging.WARNING):
        code = main_ppo.main(["--cfg", "job", *launch, "actor_rollout_ref.rollout.name=sglang", "trainer.backend=auto"])

    out = capsys.readouterr().out
    assert code == 0
    assert "name: hyflow" in out and "sglang" not in out
    assert "runs this on its own generation engine" in caplog.text  # the notice, on stderr through logging
    assert "backend: local" in out and "device: cpu" in out  # auto, resolved
    assert "ppo_micro_batch_size_per_gpu: 32" in out  # derived: 4 prompts x n=8 on one device
    assert not list(Path.cwd().iterdir())


def test_cfg_job_runs_the_full_check_not_only_the_key_names(launch, capsys):
    code = main_ppo.main(["--cfg", "job", *launch, "actor_rollout_ref.actor.ppo_mini_batch_size=3"])

    assert code == main_ppo.EXIT_BAD_CONFIG
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "data.train_batch_size=8 must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size=3" in captured.err


def test_a_malformed_override_says_what_hydra_rejected_and_how_to_quote_it(launch, capsys):
    code = main_ppo.main([*launch, "trainer.experiment_name=a=b", "data.max_promt_length=10"])

    assert code == main_ppo.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert "could not parse `trainer.experiment_name=a=b`: Hydra's override grammar rejects it" in err
    assert "the value holds '='" in err and "trainer.experiment_name='a=b'" in err
    assert "Did you mean 'data.max_prompt_length'?" in err  # the other overrides are still checked


def test_an_unknown_key_a_wrong_type_and_a_broken_rule_are_reported_together(launch, capsys):
    code = main_ppo.main(
        [*launch, "data.max_promt_length=10", "trainer.n_gpus_per_node=abc", "actor_rollout_ref.actor.optim.lr=0"]
    )

    assert code == main_ppo.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("hyflow: 3 problems in the config:")
    assert "(from `data.max_promt_length=10`)" in err
    assert "trainer.n_gpus_per_node='abc' has the wrong type: expected an integer" in err
    assert "actor_rollout_ref.actor.optim.lr=0.0 must be positive" in err


def test_the_command_line_is_parsed_once(launch, monkeypatch, capsys):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    seen: list[str] = []
    original = OverridesParser.parse_overrides

    def counting(self, overrides):
        seen.extend(overrides)
        return original(self, overrides)

    monkeypatch.setattr(OverridesParser, "parse_overrides", counting)

    assert main_ppo.main(["--cfg", "job", *launch]) == 0
    assert len(seen) == len(launch)


def test_help_is_a_short_usage_that_points_to_the_reference(capsys):
    assert main_ppo.main(["--help"]) == 0

    out = capsys.readouterr().out
    assert out.startswith("hyflow train (same as python -m hyflow.trainer.main_ppo)")
    assert len(out.splitlines()) < 25
    assert "--cfg job" in out and "docs/configuration.md" in out


def test_help_says_that_save_freq_minus_one_saves_no_checkpoint_unlike_hyflow_sft(capsys):
    assert main_ppo.main(["--help"]) == 0

    help_text = " ".join(capsys.readouterr().out.split())
    assert "The default, -1 (as verl), saves none at all: the run leaves nothing to resume or `hyflow merge`" in (
        help_text
    )
    assert "(in `hyflow sft`, -1 saves at the end)" in help_text


@pytest.mark.timeout(120)
def test_python_m_main_ppo_and_hyflow_train_are_the_same_entry(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}
    for args in (["-m", "hyflow.trainer.main_ppo", "--help"], ["-m", "hyflow", "train", "--help"]):
        result = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, check=False)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("hyflow train (same as python -m hyflow.trainer.main_ppo)")


@pytest.fixture
def bad_data_launch(tmp_path) -> tuple[list[str], Path]:
    """A launch line with a tiny model and a training file that lacks the `prompt` column; (overrides, the file)."""
    model = build_tiny_model(tmp_path / "model", arch="qwen2", hidden_size=16, num_layers=1, intermediate_size=32)
    train_file = tmp_path / "train.parquet"
    pd.DataFrame({"question": ["1+1?", "2+2?"]}).to_parquet(train_file)
    overrides = [
        f"data.train_files={train_file}",
        f"actor_rollout_ref.model.path={model}",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "trainer.backend=local",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]
    return overrides, train_file


def _run_as_python_m(module: str, args: list[str], monkeypatch) -> int:
    """`python -m <module> args...` in this process (the module's `__main__` block runs); returns its exit code."""
    monkeypatch.setattr(sys, "argv", [module, *args])
    with warnings.catch_warnings(), pytest.raises(SystemExit) as exited:
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: this test file imported the module before
        runpy.run_module(module, run_name="__main__")
    return exited.value.code


def test_python_m_main_ppo_reports_a_bad_data_file_in_the_one_line_hyflow_train_prints(
    bad_data_launch, monkeypatch, capsys
):
    overrides, train_file = bad_data_launch

    python_m_code = _run_as_python_m("hyflow.trainer.main_ppo", overrides, monkeypatch)
    python_m_err = capsys.readouterr().err
    hyflow_train_code = cli.main(["train", *overrides])
    hyflow_train_err = capsys.readouterr().err

    assert python_m_code == hyflow_train_code == cli.EXIT_USER_ERROR
    assert "Traceback" not in python_m_err
    line = python_m_err.splitlines()[-1]
    assert line == hyflow_train_err.splitlines()[-1]
    assert line.startswith(f"hyflow train: data file {str(train_file)!r}, row 0, column 'prompt': the column is")


def test_python_m_main_ppo_raises_with_the_stack_when_hyflow_traceback_is_set(bad_data_launch, monkeypatch):
    overrides, _ = bad_data_launch
    monkeypatch.setenv("HYFLOW_TRACEBACK", "1")

    with pytest.raises(ValueError, match="column 'prompt': the column is missing"):
        _run_as_python_m("hyflow.trainer.main_ppo", overrides, monkeypatch)


def test_hydra_settings_of_a_verl_script_are_ignored_with_a_notice_and_write_no_outputs_folder(launch, capsys, caplog):
    with caplog.at_level(logging.WARNING):
        code = main_ppo.main(["--cfg", "job", *launch, "hydra.run.dir=outputs/x", "hydra/job_logging=disabled"])

    assert code == 0
    assert "ignoring `hydra.run.dir=outputs/x`: hyflow reads the command line itself" in caplog.text
    assert not list(Path.cwd().iterdir())


def test_a_sweep_is_refused_with_the_fix(launch, capsys):
    assert main_ppo.main([*launch, "actor_rollout_ref.actor.optim.lr=1e-6,1e-5"]) == main_ppo.EXIT_BAD_CONFIG

    assert "is a sweep (several values); hyflow runs one config. Fix: run once per value." in capsys.readouterr().err
