"""Experiment tracking: console table, JSONL file, TensorBoard, and the lazily imported hosted trackers."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from tqdm import tqdm

from hyflow.trainer.trackers import MlflowLogger
from hyflow.trainer.tracking import ConsoleLogger, Tracking, dump_generations


def test_console_logger_prints_an_aligned_table_of_the_step():
    stream = io.StringIO()
    console = ConsoleLogger(stream, width=40)
    console.log({"critic/score/mean": 0.5, "response_length/mean": 12.0, "timing_s/gen": 1.23456}, step=3)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "step 3"
    assert [line.split()[0] for line in lines[1:]] == ["critic/score/mean", "response_length/mean", "timing_s/gen"]
    assert [line.split()[1] for line in lines[1:]] == ["0.5", "12", "1.235"]
    assert len({len(line) for line in lines[1:]}) == 1  # keys padded and values right-aligned to one width


def test_tracking_reads_tensor_metrics_back_as_numbers():
    stream = io.StringIO()
    Tracking("p", "e", loggers=["console"], stream=stream).log({"loss": torch.tensor(0.25)}, step=1)
    assert stream.getvalue().splitlines()[1].split() == ["loss", "0.25"]


def test_file_logger_writes_one_json_line_per_step(tmp_path):
    with Tracking("p", "e", loggers="file", log_dir=tmp_path) as tracking:
        tracking.log({"a": torch.tensor(1.5), "b": np.float32(2.0)}, step=1)
        tracking.log({"a": 3}, step=2)
        tracking.log_generations([("1+1=", "2", 1.0)], step=2)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "data": {"a": 1.5, "b": 2.0}}, {"step": 2, "data": {"a": 3.0}}]
    generation = json.loads((tmp_path / "generations.jsonl").read_text())
    assert generation == {"step": 2, "input": "1+1=", "output": "2", "score": 1.0}


def test_unknown_logger_lists_the_allowed_ones():
    with pytest.raises(ValueError, match=r"unknown logger\(s\) \['neptune'\].*'tensorboard'"):
        Tracking("p", "e", loggers=["console", "neptune"])


def test_a_non_numeric_metric_is_rejected_with_its_name():
    tracking = Tracking("p", "e", loggers=["console"], stream=io.StringIO())
    with pytest.raises(TypeError, match="'note'"):
        tracking.log({"note": "hello"}, step=0)


@pytest.mark.parametrize("name", ["tensorboard", "wandb", "mlflow", "swanlab"])
def test_a_missing_tracker_package_names_the_pip_package(name, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, name, None)  # makes `import name` fail
    with pytest.raises(ImportError, match=f"pip install {name}"):
        Tracking("p", "e", loggers=[name], log_dir=tmp_path)


def test_tensorboard_logger_writes_scalars_that_tensorboard_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Tracking("p", "e", loggers=["tensorboard"], log_dir=tmp_path) as tracking:
        tracking.log({"critic/score/mean": 0.25}, step=4)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    (scalar,) = events.Scalars("critic/score/mean")
    assert (scalar.step, scalar.value) == (4, 0.25)


def test_the_console_table_is_written_through_the_progress_bar(capsys):
    with tqdm(total=10, desc="training", file=sys.stdout) as bar:
        bar.update(1)
        ConsoleLogger().log({"loss": 0.5}, step=1)
        bar.update(1)
    pieces = capsys.readouterr().out.replace("\r", "\n").split("\n")
    assert "step 1" in pieces  # a line of its own, never glued onto the bar's text
    assert any(piece.startswith("training:") for piece in pieces)


def test_a_second_run_with_the_same_name_does_not_append_to_the_first_runs_file(tmp_path, caplog):
    with Tracking("p", "e", loggers="file", log_dir=tmp_path) as tracking:
        tracking.log({"a": 1.0}, step=1)
    with Tracking("p", "e", loggers="file", log_dir=tmp_path) as tracking:
        tracking.log({"a": 2.0}, step=1)
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"step": 1, "data": {"a": 2.0}}
    ]
    (earlier,) = tmp_path.glob("metrics.*-*.jsonl")
    assert json.loads(earlier.read_text()) == {"step": 1, "data": {"a": 1.0}}
    assert "held an earlier run's records" in caplog.text


class _Broken:
    def __init__(self) -> None:
        self.calls = 0

    def log(self, data, step):
        self.calls += 1
        raise OSError("disk full")


def test_a_logger_that_fails_is_reported_once_and_the_others_go_on(tmp_path, caplog):
    tracking = Tracking("p", "e", loggers=["file"], log_dir=tmp_path)
    broken = tracking.loggers["broken"] = _Broken()
    for step in (1, 2, 3):
        tracking.log({"a": float(step)}, step=step)
    tracking.finish()
    assert broken.calls == 1 and "broken" not in tracking.loggers
    assert caplog.text.count("logger 'broken' failed in log() (OSError: disk full)") == 1
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_a_logger_that_cannot_start_is_reported_and_left_out(tmp_path, caplog):
    (tmp_path / "tensorboard").write_text("a file where the event folder goes")
    pytest.importorskip("tensorboard")
    tracking = Tracking("p", "e", loggers=["tensorboard", "file"], log_dir=tmp_path)
    assert list(tracking.loggers) == ["file"]
    assert "logger 'tensorboard' could not start" in caplog.text


WANDB_RUN = """
import sys
from hyflow.trainer.tracking import Tracking

tracking = Tracking("proj", "exp", loggers=["wandb"], config={"trainer": {"seed": 1}}, log_dir=sys.argv[1])
tracking.log({"critic/score/mean": 0.25, "val-core/arith/acc/mean@4": 0.5}, step=1)
tracking.log({"critic/score/mean": 0.75}, step=2)
tracking.finish()
"""


@pytest.mark.slow  # wandb starts its service process: ~10-20 s
def test_wandb_writes_an_offline_run_whose_history_reads_back(tmp_path):
    pytest.importorskip("wandb")
    from .tracker_readers import wandb_history

    # A fresh process, as in a real run: wandb keeps per-process state (its service, the current run) that an
    # earlier test of this session would share.
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR")}
    env["WANDB_SILENT"] = "true"
    result = subprocess.run(
        [sys.executable, "-c", WANDB_RUN, str(tmp_path)], env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "logger 'wandb'" not in result.stderr  # it neither failed to start nor failed later
    (run_folder,) = (tmp_path / "wandb").glob("offline-run-*")
    rows = wandb_history(run_folder)
    assert [(row["_step"], row["critic/score/mean"]) for row in rows] == [(1, 0.25), (2, 0.75)]
    assert rows[0]["val-core/arith/acc/mean@4"] == 0.5


@pytest.mark.slow  # a new SQLite store runs MLflow's schema migrations: ~10-60 s
def test_mlflow_writes_a_local_sqlite_store_that_search_runs_reads_back(monkeypatch, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    log_dir = tmp_path / "logs"
    tracking = Tracking("proj", "exp", loggers=["mlflow"], config={"algorithm": {"gamma": 1.0}}, log_dir=log_dir)
    step = {"timing_s/gen": 1.5, "timing_s/gen/reward": 0.5, "val-core/gsm8k/reward/mean@4": 0.25}
    tracking.log(step, step=1)
    tracking.log_generations([("1+1=", "2", 1.0)], step=1)
    tracking.finish()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["logs"]  # no ./mlruns beside it
    mlflow.set_tracking_uri(f"sqlite:///{log_dir / 'mlflow.db'}")
    (run,) = mlflow.search_runs(experiment_names=["proj"], output_format="list")
    assert run.data.metrics == {
        "timing_s/gen/value": 1.5,  # a name that is also a folder of names cannot live in a file store
        "timing_s/gen/reward": 0.5,
        "val-core/gsm8k/reward/mean_at_4": 0.25,
    }
    assert run.data.params == {"algorithm.gamma": "1.0"} and run.info.run_name == "exp"
    assert run.info.artifact_uri.startswith((log_dir / "mlartifacts").as_uri())


def test_mlflow_names_stay_the_same_from_step_to_step():
    names = MlflowLogger.__new__(MlflowLogger)
    names._names = {}
    assert names._mlflow_names(["a/b", "a/b/c", "x(y)@2"]) == ["a/b/value", "a/b/c", "x_y__at_2"]
    assert names._mlflow_names(["a/b", "d", "a"]) == ["a/b/value", "d", "a/value"]  # "a" holds "a/b/c"


def test_generations_are_dumped_as_one_json_line_per_sample(tmp_path):
    path = dump_generations(
        tmp_path / "rollouts",
        step=5,
        inputs=["q1", "q2"],
        outputs=["a1", "a2"],
        scores=[1.0, np.float32(0.0)],
        ground_truths=["a1", "b"],
        extra={"acc": np.array([True, False])},
    )
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert path.name == "5.jsonl"
    assert rows[1] == {"input": "q2", "output": "a2", "score": 0.0, "ground_truth": "b", "acc": False, "step": 5}


def test_dump_with_a_short_column_names_the_column(tmp_path):
    with pytest.raises(ValueError, match="'score' has 1 values for 2 samples"):
        dump_generations(tmp_path, 0, ["q1", "q2"], ["a1", "a2"], [1.0])
