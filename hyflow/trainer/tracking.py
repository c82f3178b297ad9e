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
import importlib
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from tqdm import tqdm

__all__ = ["LOGGERS", "Tracking", "dump_generations"]

logger = logging.getLogger(__name__)

Generation = tuple[str, str, float]  # (input, output, score)


def _import_optional(module: str, package: str, logger_name: str) -> Any:
    """Import `module`, or raise an ImportError that names the pip package and the config key."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"trainer.logger includes '{logger_name}', which needs the '{package}' package: pip install {package} "
            f"(or remove '{logger_name}' from trainer.logger)."
        ) from error


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


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} → {"a.b": 1}, for trackers whose parameters are flat."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


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


class TensorboardLogger:
    """Scalars and generation text to TensorBoard event files under `<log_dir>/tensorboard`."""

    def __init__(self, log_dir: Path) -> None:
        _import_optional("tensorboard", "tensorboard", "tensorboard")
        summary = importlib.import_module("torch.utils.tensorboard")
        self.writer = summary.SummaryWriter(log_dir=str(log_dir / "tensorboard"))

    def log(self, data: dict[str, float], step: int) -> None:
        for key, value in data.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        text = "\n\n".join(f"**score {score}**\n\n{prompt}\n\n{output}" for prompt, output, score in samples)
        self.writer.add_text("generations", text, global_step=step)

    def finish(self) -> None:
        self.writer.close()


class WandbLogger:
    """Weights & Biases; offline unless an API key (`WANDB_API_KEY`) or an explicit `WANDB_MODE` is set."""

    def __init__(self, project: str, experiment: str, config: dict[str, Any], log_dir: Path) -> None:
        self.wandb = _import_optional("wandb", "wandb", "wandb")
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        log_dir.mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(project=project, name=experiment, config=config, mode=mode, dir=str(log_dir))

    def log(self, data: dict[str, float], step: int) -> None:
        self.run.log(data, step=step)

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        table = self.wandb.Table(columns=["input", "output", "score"], data=[list(s) for s in samples])
        self.run.log({"generations": table}, step=step)

    def finish(self) -> None:
        self.run.finish()


_MLFLOW_BAD_CHARS = re.compile(r"[^0-9A-Za-z_\-. /:]")


class MlflowLogger:
    """MLflow; a local SQLite store `<log_dir>/mlflow.db` unless `MLFLOW_TRACKING_URI` is set.

    Read it back with `mlflow.set_tracking_uri("sqlite:///<log_dir>/mlflow.db"); mlflow.search_runs(...)`, or
    browse it with `mlflow ui --backend-store-uri sqlite:///<log_dir>/mlflow.db`. (MLflow 3 keeps its file store
    in maintenance mode, hence SQLite, as verl does.) Metric names are made legal for every store: MLflow allows
    letters, digits and `_-. /:` only, so `@` becomes `_at_` (`mean@4` → `mean_at_4`) and other characters `_`;
    and a name that is also the folder of other names (`timing_s/gen` beside `timing_s/gen/reward`, which a file
    store cannot hold) gets `/value` appended (`timing_s/gen/value`).
    """

    def __init__(self, project: str, experiment: str, config: dict[str, Any], log_dir: Path) -> None:
        self.mlflow = _import_optional("mlflow", "mlflow", "mlflow")
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            _import_optional("sqlalchemy", "sqlalchemy alembic", "mlflow")  # the SQLite store (mlflow-skinny lacks it)
            log_dir.mkdir(parents=True, exist_ok=True)
            self.mlflow.set_tracking_uri(f"sqlite:///{(log_dir / 'mlflow.db').resolve()}")
            if self.mlflow.get_experiment_by_name(project) is None:  # artifacts beside the store, not in ./mlruns
                self.mlflow.create_experiment(project, artifact_location=(log_dir / "mlartifacts").resolve().as_uri())
        self.mlflow.set_experiment(project)
        self.mlflow.start_run(run_name=experiment)
        params = {key: str(value)[:500] for key, value in _flatten(config).items()}
        if params:
            self.mlflow.log_params(params)
        self._names: dict[str, str] = {}  # metric key -> its MLflow name, fixed at the key's first step

    @staticmethod
    def metric_name(key: str) -> str:
        return _MLFLOW_BAD_CHARS.sub("_", key.replace("@", "_at_"))

    def _mlflow_names(self, keys: Sequence[str]) -> list[str]:
        """Legal names; a name that other names of this step or an earlier one nest under gets `/value`."""
        new = [key for key in keys if key not in self._names]
        if new:
            legal = {key: self.metric_name(key) for key in new}
            names = [*legal.values(), *self._names.values()]
            folders = {name[:i] for name in names for i, char in enumerate(name) if char == "/"}
            for key, name in legal.items():
                self._names[key] = f"{name}/value" if name in folders else name
        return [self._names[key] for key in keys]

    def log(self, data: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(dict(zip(self._mlflow_names(list(data)), data.values())), step=step)

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        lines = [json.dumps({"input": p, "output": o, "score": s}) for p, o, s in samples]
        self.mlflow.log_text("\n".join(lines), f"generations/step_{step}.jsonl")

    def finish(self) -> None:
        self.mlflow.end_run()


class SwanlabLogger:
    """SwanLab; local mode (files under `<log_dir>/swanlog`) unless `SWANLAB_API_KEY` or `SWANLAB_MODE` is set."""

    def __init__(self, project: str, experiment: str, config: dict[str, Any], log_dir: Path) -> None:
        self.swanlab = _import_optional("swanlab", "swanlab", "swanlab")
        mode = os.environ.get("SWANLAB_MODE") or ("cloud" if os.environ.get("SWANLAB_API_KEY") else "local")
        logdir = log_dir / "swanlog"
        logdir.mkdir(parents=True, exist_ok=True)
        self.swanlab.init(project=project, experiment_name=experiment, config=config, logdir=str(logdir), mode=mode)

    def log(self, data: dict[str, float], step: int) -> None:
        self.swanlab.log(data, step=step)

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        text = "\n\n".join(f"score {score}\n{prompt}\n{output}" for prompt, output, score in samples)
        self.swanlab.log({"generations": self.swanlab.Text(text)}, step=step)

    def finish(self) -> None:
        self.swanlab.finish()


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
