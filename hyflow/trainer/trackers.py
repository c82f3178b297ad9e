"""The third-party trackers behind `trainer.logger`: TensorBoard, Weights & Biases, MLflow, SwanLab.

Each is a class with `log(data, step)`, `log_generations(samples, step)` and `finish()`, built by
`hyflow.trainer.tracking.Tracking`, and imports its package only when selected (a missing package is an ImportError
naming the pip package and the config key). Where each writes: the module docstring of `hyflow.trainer.tracking`
and docs/howto/loggers.md.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
