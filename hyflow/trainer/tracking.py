"""Experiment tracking: one `Tracking` object fans each step's metrics out to the loggers in `trainer.logger`.

    tracking = Tracking("hyflow", "grpo-arith", loggers=["console", "file"], config=cfg, log_dir="logs/run1")
    tracking.log({"critic/score/mean": 0.5, "timing_s/gen": 1.2}, step=3)
    tracking.log_generations([("1+2=", "3", 1.0)], step=3)
    tracking.finish()

Loggers (`log_dir` defaults to `logs/<project>/<experiment>`, relative to the working folder):
- `console`: an aligned table of the metrics on stdout, one block per step, written through tqdm so that it never
  glues onto a progress bar;
- `file`: JSONL, one line `{"step": N, "data": {...}}` per step, at `<log_dir>/metrics.jsonl` (generations:
  `{"step", "input", "output", "score"}` lines in `generations.jsonl`). A new run never appends to an old run's
  file: an existing one is renamed `metrics.<its time>.jsonl` first, with a warning;
- `tensorboard`: `torch.utils.tensorboard` event files under `<log_dir>/tensorboard` (`pip install tensorboard`);
- `wandb`: Weights & Biases, offline (files under `<log_dir>/wandb`) unless `WANDB_API_KEY` or `WANDB_MODE` is set;
- `mlflow`: a local SQLite store `<log_dir>/mlflow.db` (artifacts in `<log_dir>/mlartifacts`) unless
  `MLFLOW_TRACKING_URI` is set; metric names are made legal and collision-free for every MLflow store;
- `swanlab`: SwanLab, local mode unless `SWANLAB_API_KEY` or `SWANLAB_MODE` is set.
The last four import their package only when selected, and say which package to install when it is missing (the
`loggers` extra pins versions that work). A missing package is an error when `Tracking` is built, before any
compute is spent; a logger that fails later (a full disk, a tracker that raises) is reported once and disabled, and
training goes on with the others.

`dump_generations` writes one step's generations to `<trainer.rollout_data_dir>/<step>.jsonl`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from tqdm import tqdm

from hyflow.trainer.trackers import Generation, MlflowLogger, SwanlabLogger, TensorboardLogger, WandbLogger

__all__ = ["LOGGERS", "ConsoleLogger", "FileLogger", "Tracking", "dump_generations"]

logger = logging.getLogger(__name__)


def _config_dict(config: Any) -> dict[str, Any]:
    """The run config as a plain dict (dataclass, OmegaConf or mapping); {} for None."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if hasattr(config, "_metadata") and hasattr(config, "_content"):  # an OmegaConf container
        from omegaconf import OmegaConf

        return OmegaConf.to_container(config, resolve=True)
    return dict(config)


def _to_floats(data: Mapping[str, Any]) -> dict[str, float]:
    """Numbers and 0-d tensors/arrays as floats; tensors are read back in one host sync."""
    tensor_keys = [key for key, value in data.items() if isinstance(value, torch.Tensor)]
    out: dict[str, float] = {}
    if tensor_keys:
        stacked = torch.stack([data[key].detach().float().reshape(()).cpu() for key in tensor_keys]).tolist()
        out.update(zip(tensor_keys, stacked))
    for key, value in data.items():
        if key in out:
            continue
        if isinstance(value, bool | int | float | np.number) or (isinstance(value, np.ndarray) and value.size == 1):
            out[key] = float(value)
        else:
            raise TypeError(f"metric '{key}' is a {type(value).__name__}; tracked metrics must be numbers.")
    return dict(sorted(out.items()))


def _format_value(value: float) -> str:
    if math.isfinite(value) and value == int(value) and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.4g}"


class ConsoleLogger:
    """Prints each step as an aligned table of `name value` columns (to stdout by default)."""

    def __init__(self, stream: TextIO | None = None, width: int = 150) -> None:
        self.stream = stream
        self.width = width

    def _write(self, text: str) -> None:
        """To the given stream; to stdout through `tqdm.write`, which clears and redraws any progress bar."""
        if self.stream is not None:
            self.stream.write(text + "\n")
            self.stream.flush()
        else:
            tqdm.write(text, file=sys.stdout)

    def log(self, data: dict[str, float], step: int) -> None:
        cells = [(key, _format_value(value)) for key, value in data.items()]
        key_width = min(max((len(key) for key, _ in cells), default=0), 48)
        value_width = max((len(text) for _, text in cells), default=0)
        cell_width = key_width + 1 + value_width
        columns = max(1, (self.width + 3) // (cell_width + 3))
        lines = [f"step {step}"]
        for start in range(0, len(cells), columns):
            row = cells[start : start + columns]
            lines.append("   ".join(f"{key:<{key_width}} {text:>{value_width}}" for key, text in row).rstrip())
        self._write("\n".join(lines))

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        for prompt, output, score in samples:
            self._write(f"[step {step}] score={_format_value(score)}\n  input: {prompt!r}\n  output: {output!r}")

    def finish(self) -> None:
        """Nothing to close."""


def _set_aside(path: Path) -> None:
    """Rename an earlier run's `path` to `<stem>.<its modification time><suffix>`, so that nothing appends to it."""
    if not path.exists():
        return
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
    target = path.with_name(f"{path.stem}.{stamp}{path.suffix}")
    counter = 1
    while target.exists():
        target = path.with_name(f"{path.stem}.{stamp}-{counter}{path.suffix}")
        counter += 1
    path.rename(target)
    logger.warning("%s held an earlier run's records: moved to %s; this run writes a new %s", path, target, path.name)


class FileLogger:
    """Writes `{"step": N, "data": {...}}` lines to `<log_dir>/metrics.jsonl` (generations to generations.jsonl).

    An earlier run's files in the same folder (the same project and experiment name) are renamed first.
    """

    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / "metrics.jsonl"
        self.generations_path = log_dir / "generations.jsonl"
        for path in (self.path, self.generations_path):
            _set_aside(path)
        self._file = self.path.open("w", encoding="utf-8")
        logger.info("file logger: metrics go to %s", self.path)

    def log(self, data: dict[str, float], step: int) -> None:
        self._file.write(json.dumps({"step": step, "data": data}) + "\n")
        self._file.flush()

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        with self.generations_path.open("a", encoding="utf-8") as file:
            for prompt, output, score in samples:
                file.write(json.dumps({"step": step, "input": prompt, "output": output, "score": score}) + "\n")

    def finish(self) -> None:
        self._file.close()


LOGGERS = ("console", "file", "tensorboard", "wandb", "mlflow", "swanlab")


class Tracking:
    """Fans metrics out to the selected loggers. `loggers` is a list of names from `LOGGERS` (or one name).

    `log_dir` (default `logs/<project>/<experiment>`) holds the file, TensorBoard, W&B, MLflow and SwanLab output.
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        loggers: str | Sequence[str] = "console",
        config: Any = None,
        log_dir: str | os.PathLike | None = None,
        stream: TextIO | None = None,
    ) -> None:
        names = [loggers] if isinstance(loggers, str) else list(loggers)
        unknown = [name for name in names if name not in LOGGERS]
        if unknown:
            raise ValueError(
                f"trainer.logger={names} has unknown logger(s) {unknown}. Allowed values: {list(LOGGERS)}."
            )
        self.log_dir = Path(log_dir) if log_dir is not None else Path("logs") / project_name / experiment_name
        config_dict = _config_dict(config)
        self.loggers: dict[str, Any] = {}
        for name in dict.fromkeys(names):
            try:
                self.loggers[name] = self._build(name, project_name, experiment_name, config_dict, stream)
            except ImportError:
                raise  # a missing package: a config error, reported before any compute is spent
            except Exception as error:
                self._report(name, "could not start", error)

    def _build(self, name: str, project: str, experiment: str, config: dict[str, Any], stream: TextIO | None) -> Any:
        if name == "console":
            return ConsoleLogger(stream)
        if name == "file":
            return FileLogger(self.log_dir)
        if name == "tensorboard":
            return TensorboardLogger(self.log_dir)
        backend = {"wandb": WandbLogger, "mlflow": MlflowLogger, "swanlab": SwanlabLogger}[name]
        return backend(project, experiment, config, self.log_dir)

    @staticmethod
    def _report(name: str, what: str, error: BaseException) -> None:
        logger.warning(
            "logger '%s' %s (%s: %s); it is disabled for the rest of the run, the other loggers go on",
            name,
            what,
            type(error).__name__,
            error,
        )

    def _call_each(self, method: str, *args: Any) -> None:
        """`backend.method(*args)` on every logger; one that raises is reported once and dropped."""
        for name, backend in list(self.loggers.items()):
            try:
                getattr(backend, method)(*args)
            except Exception as error:
                self._report(name, f"failed in {method}()", error)
                del self.loggers[name]

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Log one step's metrics (numbers or 0-d tensors, read back in one host sync) to every logger."""
        self._call_each("log", _to_floats(data), step)

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        """Log a few (input, output, score) samples as text, e.g. `trainer.log_val_generations` of them."""
        self._call_each("log_generations", list(samples), step)

    def finish(self) -> None:
        """Flush and close every logger (call once, at the end of training)."""
        self._call_each("finish")

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.finish()


def dump_generations(
    dump_dir: str | os.PathLike,
    step: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
    scores: Sequence[float],
    ground_truths: Sequence[Any] | None = None,
    extra: Mapping[str, Sequence[Any]] | None = None,
) -> Path:
    """Write one step's generations to `<dump_dir>/<step>.jsonl`: one JSON object per sample.

    Each line holds `input`, `output`, `score`, `step`, `ground_truth` (when given) and one entry per `extra`
    column (reward extra info such as `acc`). Every column needs one value per sample.
    """
    columns: dict[str, Sequence[Any]] = {"input": inputs, "output": outputs, "score": scores}
    if ground_truths is not None:
        columns["ground_truth"] = ground_truths
    columns.update(extra or {})
    for name, values in columns.items():
        if len(values) != len(inputs):
            raise ValueError(
                f"dump_generations: column '{name}' has {len(values)} values for {len(inputs)} samples; "
                f"every column needs one value per sample."
            )
    path = Path(dump_dir) / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as file:
        for i in range(len(inputs)):
            row = {name: values[i] for name, values in columns.items()}
            row["step"] = step
            file.write(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")
    logger.info("dumped %d generations to %s", len(inputs), path)
    return path


def _json_default(value: Any) -> Any:
    """Numpy and torch values as Python numbers and lists; anything else JSON cannot hold as its string."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
