"""What `hyflow demo` shows: a compact live table of each step, and the curves saved as a PNG (or CSV).

    table = DemoTable(stream=sys.stdout)
    table.log({"critic/score/mean": 0.4, "val-core/arith/acc/mean@1": 0.3}, step=1)   # one row per step
    print(summary(table.rows, seconds=60))     # validation accuracy (or reward), calculator calls: first -> last
    save_curves(table.rows, "out/demo")        # out/demo/curves.png with matplotlib, else out/demo/curves.csv

The names are README's: `val_acc` is the validation accuracy of a task whose scorer reports `acc` (arith,
countdown, tools, vision), `val_rew` the validation reward of one whose score is a plain number (openai_agent:
the agent's own reward, which is not an accuracy), `calls` the calculator calls per episode of an agent task.

Rows are written through `tqdm.write`, so that they never glue onto the trainer's progress bar. `DemoTable` is a
tracking backend (it has Tracking's `log` / `log_generations` / `finish`), so the demo adds it to
the PPO trainer's `Tracking` next to (or instead of) the console logger. The PNG needs matplotlib
(`pip install matplotlib`, or the `demo` extra); without it the curves are written as CSV, which any spreadsheet
or `python -c "import pandas as pd; pd.read_csv('curves.csv').plot(x='step')"` draws.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TextIO

from tqdm import tqdm

logger = logging.getLogger(__name__)

SCORE_KEY = "critic/score/mean"
STEP_TIME_KEY = "timing_s/step"
TOOL_CALLS_KEY = "agent/num_tool_calls/mean"  # tool calls per episode (the calculator: the demos' only tool)


def val_mean(data: dict[str, float], var: str) -> float | None:
    """The mean of `val-core/<source>/<var>/mean@N` over data sources, or None when the step has none."""
    values = [v for k, v in data.items() if k.startswith("val-core/") and f"/{var}/mean@" in k]
    return sum(values) / len(values) if values else None


def val_accuracy(data: dict[str, float]) -> float | None:
    """The headline validation accuracy of a metrics dict: the mean of `val-core/<source>/acc/mean@N` over data
    sources, or None when the step did not validate or its scorer reports no accuracy (see `val_reward`)."""
    return val_mean(data, "acc")


def val_reward(data: dict[str, float]) -> float | None:
    """The validation reward of a task whose scorer reports no accuracy (`val-core/<source>/reward/mean@N`), or None
    when the step did not validate or has an accuracy (`val_accuracy`)."""
    return None if val_accuracy(data) is not None else val_mean(data, "reward")


@dataclass
class CurvePoint:
    """One row of the demo's table and curves (NaN where a step has no such value)."""

    phase: str  # "sft" or "grpo"
    step: int
    train_loss: float = math.nan  # SFT: token-mean NLL of the assistant tokens
    reward: float = math.nan  # GRPO: mean task score of the step's samples
    val_accuracy: float = math.nan  # `val_accuracy` of the step's validation
    val_reward: float = math.nan  # `val_reward`: tasks scored by a number that is not an accuracy
    tool_calls: float = math.nan  # GRPO on an agent task: calculator calls per episode
    seconds: float = math.nan


def _cell(value: float, width: int, digits: int = 3) -> str:
    return f"{'-':>{width}}" if math.isnan(value) else f"{value:>{width}.{digits}f}"


class DemoTable:
    """Prints one short row per step and keeps the rows for `save_curves`."""

    def __init__(self, phase: str = "grpo", stream: TextIO | None = None) -> None:
        self.phase = phase
        self.stream = stream or sys.stdout
        self.rows: list[CurvePoint] = []
        self._printed_header = False

    def header(self) -> None:
        names = f"{'loss':>7} {'reward':>7} {'val_acc':>8} {'val_rew':>8} {'calls':>6} {'sec':>6}"
        self._print(f"{'phase':<5} {'step':>5} {names}")
        self._printed_header = True

    def add(self, point: CurvePoint) -> None:
        if not self._printed_header:
            self.header()
        self.rows.append(point)
        cells = [
            f"{point.phase:<5} {point.step:>5}",
            _cell(point.train_loss, 7),
            _cell(point.reward, 7),
            _cell(point.val_accuracy, 8),
            _cell(point.val_reward, 8),
            _cell(point.tool_calls, 6, 2),
            _cell(point.seconds, 6, 1),
        ]
        self._print(" ".join(cells))

    def _print(self, line: str) -> None:
        """Through `tqdm.write`, which clears the progress bar and redraws it below: rows never glue onto it."""
        tqdm.write(line, file=self.stream)
        self.stream.flush()

    # ---- the Tracking backend interface ----
    def log(self, data: dict[str, float], step: int) -> None:
        """A PPO trainer step (or the validation before training, at step 0)."""
        accuracy, reward = val_accuracy(data), val_reward(data)
        point = CurvePoint(
            self.phase,
            step,
            reward=data.get(SCORE_KEY, math.nan),
            val_accuracy=math.nan if accuracy is None else accuracy,
            val_reward=math.nan if reward is None else reward,
            tool_calls=data.get(TOOL_CALLS_KEY, math.nan),
            seconds=data.get(STEP_TIME_KEY, math.nan),
        )
        self.add(point)

    def log_generations(self, samples: Sequence[tuple[str, str, float]], step: int) -> None:
        for prompt, response, score in samples[:2]:
            prompt_tail = prompt[-60:].replace("\n", " ")
            self._print(f"      sample: ...{prompt_tail!r} -> {response.strip()!r} (score {score:g})")

    def finish(self) -> None:
        self.stream.flush()


def _first_and_last(rows: Sequence[CurvePoint], name: str) -> tuple[CurvePoint, CurvePoint] | None:
    """The first and last GRPO rows that have a value for `name`, or None when fewer than two have one."""
    found = [row for row in rows if row.phase == "grpo" and not math.isnan(getattr(row, name))]
    return (found[0], found[-1]) if len(found) >= 2 else None


def summary(rows: Sequence[CurvePoint], seconds: float) -> str:
    """What README quotes of a demo run, under README's names: the validation accuracy (or reward, for a task
    scored by a number that is not an accuracy) after SFT and after GRPO, the calculator calls per episode at the
    first and last GRPO step (agent tasks), and the wall time."""
    lines = []
    if pair := _first_and_last(rows, "val_accuracy"):
        first, last = pair[0].val_accuracy, pair[1].val_accuracy
        change = f"{100 * (last - first):+.1f} points"
        lines.append(f"validation accuracy: {100 * first:.1f}% after SFT -> {100 * last:.1f}% after GRPO ({change})")
    if pair := _first_and_last(rows, "val_reward"):
        first, last = pair[0].val_reward, pair[1].val_reward
        lines.append(f"validation reward: {first:.3f} after SFT -> {last:.3f} after GRPO ({last - first:+.3f})")
    if pair := _first_and_last(rows, "tool_calls"):
        start, end = pair
        calls = f"{start.tool_calls:.2f} at GRPO step {start.step} -> {end.tool_calls:.2f} at step {end.step}"
        lines.append(f"calculator calls per episode: {calls}")
    return "\n".join([*lines, f"wall time {seconds:.0f} s"])


def save_curves(rows: Sequence[CurvePoint], folder: str | os.PathLike, title: str = "hyflow demo") -> str:
    """Write the curves to `folder/curves.png` (matplotlib) or `folder/curves.csv`; return the path written."""
    os.makedirs(folder, exist_ok=True)
    csv_path = os.path.join(folder, "curves.csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(CurvePoint("", 0))))
        writer.writeheader()
        writer.writerows(asdict(row) for row in rows)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info("matplotlib is not installed: curves written as CSV only (%s)", csv_path)
        return csv_path
    png_path = os.path.join(folder, "curves.png")
    fig, (sft_ax, rl_ax) = plt.subplots(1, 2, figsize=(11, 4))
    _plot(sft_ax, [r for r in rows if r.phase == "sft"], [("train_loss", "train loss")], "SFT")
    series = [("reward", "reward"), ("val_accuracy", "val accuracy"), ("val_reward", "val reward")]
    _plot(rl_ax, [r for r in rows if r.phase == "grpo"], [*series, ("tool_calls", "calculator calls")], "GRPO")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path


def _plot(axis, rows: Sequence[CurvePoint], series: list[tuple[str, str]], name: str) -> None:
    for field_name, label in series:
        points = [(r.step, getattr(r, field_name)) for r in rows if not math.isnan(getattr(r, field_name))]
        if points:
            axis.plot(*zip(*points), marker="o" if len(points) < 30 else None, label=label)
    axis.set_title(name)
    axis.set_xlabel("step")
    axis.grid(alpha=0.3)
    if axis.lines:  # a phase that did not run (e.g. --grpo-steps 0) has an empty panel, without a legend
        axis.legend()
