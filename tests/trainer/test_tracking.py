"""Experiment tracking: console table, JSONL file, TensorBoard, and the lazily imported hosted trackers."""

import io
import json
import sys
import types

import numpy as np
import pytest
import torch

from hyflow.trainer.tracking import ConsoleLogger, MlflowLogger, Tracking, dump_generations


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


def _fake_module(name: str, calls: list) -> types.ModuleType:
    """A stand-in for a tracker package that records the calls made to it."""
    module = types.ModuleType(name)

    def record(fn_name):
        return lambda *args, **kwargs: calls.append((fn_name, args, kwargs)) or run

    run = types.SimpleNamespace(log=record("run.log"), finish=record("run.finish"))
    for fn_name in ("init", "log", "finish", "set_tracking_uri", "set_experiment", "start_run", "log_params"):
        setattr(module, fn_name, record(fn_name))
    module.log_metrics = record("log_metrics")
    module.end_run = record("end_run")
    return module


def test_wandb_runs_offline_without_an_api_key(monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setitem(sys.modules, "wandb", _fake_module("wandb", calls))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    tracking = Tracking("proj", "exp", loggers=["wandb"], config={"trainer": {"seed": 1}}, log_dir=tmp_path)
    tracking.log({"x": 1.0}, step=7)
    tracking.finish()
    init = next(kwargs for name, _, kwargs in calls if name == "init")
    assert init["mode"] == "offline" and init["project"] == "proj" and init["name"] == "exp"
    assert init["config"] == {"trainer": {"seed": 1}}
    assert ("run.log", ({"x": 1.0},), {"step": 7}) in calls


def test_mlflow_uses_a_local_file_store_and_legal_metric_names(monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setitem(sys.modules, "mlflow", _fake_module("mlflow", calls))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracking = Tracking("proj", "exp", loggers=["mlflow"], config={"algorithm": {"gamma": 1.0}}, log_dir=tmp_path)
    tracking.log({"val-core/gsm8k/reward/mean@4": 0.5}, step=2)
    uri = next(args[0] for name, args, _ in calls if name == "set_tracking_uri")
    assert uri.startswith("file://") and uri.endswith("/mlruns")
    assert ("log_params", ({"algorithm.gamma": "1.0"},), {}) in calls
    assert ("log_metrics", ({"val-core/gsm8k/reward/mean_at_4": 0.5},), {"step": 2}) in calls
    assert MlflowLogger.metric_name("a(b)@2") == "a_b__at_2"


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
