"""`hyflow train` with neither a model nor data: the embedded default (`hyflow demo`'s tiny model and task)."""

from __future__ import annotations

import json

import pytest

from hyflow.demos.runner import DemoPlan
from hyflow.trainer import embedded_default, main_ppo


@pytest.fixture
def hyflow_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HYFLOW_HOME", str(tmp_path / "hyflow-home"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path / "hyflow-home" / "embedded_default"


def test_cfg_job_without_a_model_or_data_prints_the_embedded_default_and_builds_nothing(hyflow_home, capsys):
    assert main_ppo.main(["--cfg", "job"]) == 0

    out = capsys.readouterr().out
    assert f"path: {hyflow_home}/sft/huggingface" in out
    assert f"train_files: {hyflow_home}/data/train.parquet" in out
    assert "adv_estimator: grpo" in out and "backend: local" in out
    assert "- console" in out  # logs to the console, not to the demo's table
    assert not hyflow_home.exists()


@pytest.mark.slow  # SFT of the tiny model (3 steps) and one GRPO step: ~25 s on 2 busy cores
@pytest.mark.timeout(300)
def test_hyflow_train_without_a_model_or_data_builds_the_embedded_default_once_and_trains_on_it(
    hyflow_home, monkeypatch, tmp_path
):
    small = DemoPlan(train_size=32, test_size=8, sft_steps=3, sft_batch_size=8, grpo_prompts=4, grpo_samples=2)
    monkeypatch.setattr(embedded_default, "plan", lambda: small)
    run = ["trainer.total_training_steps=1", "trainer.val_before_train=False", "trainer.logger=[file]"]

    assert main_ppo.main(run) == 0

    assert embedded_default.is_built()
    assert (hyflow_home / "sft" / "huggingface" / "config.json").is_file()
    (metrics,) = (tmp_path / "work" / "logs").rglob("metrics.jsonl")
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [s["step"] for s in steps] == [1]
    assert "actor/pg_loss" in steps[0]["data"]
    assert not (tmp_path / "work" / "checkpoints").exists()  # the demo's save_freq=-1: no checkpoints
