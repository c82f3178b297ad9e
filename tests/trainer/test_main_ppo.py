"""The Hydra entry: `python -m hyflow.trainer.main_ppo` and `hyflow train` (a few subprocesses, ~1 s each)."""

import os
import subprocess
import sys

import pytest

from hyflow.trainer import main_ppo

QUICKSTART_HEAD = [
    "data.train_files=$HOME/data/gsm8k/train.parquet",
    "data.train_batch_size=256",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.name=vllm",
    "trainer.logger=console",
]


def _run(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env, check=False
    )


@pytest.mark.timeout(150)
def test_cfg_job_prints_the_composed_config_with_the_overrides(tmp_path):
    result = _run(["-m", "hyflow.trainer.main_ppo", "--cfg", "job", *QUICKSTART_HEAD], tmp_path)

    assert result.returncode == 0, result.stderr
    assert "train_batch_size: 256" in result.stdout
    assert "path: Qwen/Qwen2.5-0.5B-Instruct" in result.stdout
    assert "ppo_micro_batch_size_per_gpu: 4" in result.stdout
    assert not list(tmp_path.iterdir())  # --cfg job runs nothing and writes nothing


@pytest.mark.timeout(150)
def test_hyflow_train_help_is_a_short_usage_that_points_to_the_keys(tmp_path):
    result = _run(["-m", "hyflow", "train", "--help"], tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("hyflow train (same as python -m hyflow.trainer.main_ppo)")
    assert "hyflow train --cfg job" in result.stdout and "docs/configuration.md" in result.stdout
    assert len(result.stdout.splitlines()) < 20


@pytest.mark.timeout(150)
def test_a_run_leaves_no_hydra_outputs_folder_in_the_working_folder(tmp_path):
    result = _run(["-m", "hyflow", "train", "data.train_batch_size=abc"], tmp_path)

    assert result.returncode == main_ppo.EXIT_BAD_CONFIG, result.stderr
    assert not list(tmp_path.iterdir())  # Hydra ran (it composed the config) but wrote nothing here


def test_an_unknown_key_on_the_command_line_stops_before_hydra_with_a_suggestion(capsys):
    code = main_ppo.main(["data.max_promt_length=10", "trainer.n_gpus_per_node=abc"])

    assert code == main_ppo.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert "Did you mean 'data.max_prompt_length'?" in err
    assert "(from `data.max_promt_length=10`)" in err


def test_a_wrong_type_found_after_hydra_composes_exits_with_the_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["main_ppo"])  # main() hands its arguments to Hydra through sys.argv
    overrides = [f"hydra.run.dir={tmp_path}", "hydra.output_subdir=null", "hydra/job_logging=none"]

    with pytest.raises(SystemExit) as caught:
        main_ppo.main([*overrides, "data.train_batch_size=abc"])

    assert caught.value.code == main_ppo.EXIT_BAD_CONFIG
    assert "data.train_batch_size='abc' has the wrong type: expected an integer" in capsys.readouterr().err
