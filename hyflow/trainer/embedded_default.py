"""The embedded default: what `hyflow train` (and `python -m hyflow.trainer.main_ppo`) runs when the command line
names neither `actor_rollout_ref.model.path` nor `data.train_files`.

It is `hyflow demo`'s GRPO phase (`hyflow.demos.runner`): the demo's tiny model, SFT-trained on the synthetic
arithmetic task so that it is partly right, then GRPO on that task with the demo's settings
(`hyflow.demos.runner.grpo_overrides`), logged to the console. The model and data are built once, on first use,
under `$HYFLOW_HOME/embedded_default`
(`~/.cache/hyflow/embedded_default` by default; the first run spends the demo's SFT phase, a few minutes on a
laptop CPU) and reused afterwards.
Any other override on the command line applies on top (`hyflow train trainer.total_training_steps=5`).
`--cfg job` builds nothing: before the first run it prints the paths where the model and data will be.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

    from hyflow.demos.runner import DemoPlan

logger = logging.getLogger(__name__)

TRIGGER_KEYS = ("actor_rollout_ref.model.path", "data.train_files")
READY_MARKER = "ready"
# The demo's settings that do not suit a `hyflow train` run: it logs to its own table, picks a device itself and
# keeps its checkpoints next to the demo's files.
_DEMO_ONLY = ("trainer.logger=", "trainer.device=", "trainer.default_local_dir=")


def is_wanted(parsed: Sequence[Override]) -> bool:
    """Whether a command line asks for the embedded default: it sets neither a model nor training data."""
    return not any(override.key_or_group in TRIGGER_KEYS for override in parsed)


def home() -> Path:
    """Where the embedded default's model and data live."""
    return Path(os.environ.get("HYFLOW_HOME", "~/.cache/hyflow")).expanduser() / "embedded_default"


def plan() -> DemoPlan:
    """The demo run whose model, data and GRPO settings the embedded default takes (the demo's defaults)."""
    from hyflow.demos.runner import DemoPlan

    return DemoPlan()


def is_built() -> bool:
    """Whether an earlier run left the model and data complete (the marker file is written last)."""
    return (home() / READY_MARKER).is_file()


def overrides(build: bool = True) -> list[str]:
    """The demo's GRPO overrides, on the embedded model and data; `build` makes them first when missing (without
    it the paths are where they will be)."""
    from hyflow.demos.runner import grpo_overrides
    from hyflow.trainer.sft_trainer import HF_DIR

    demo_plan, folder = plan(), home()
    model = str(folder / "sft" / HF_DIR)
    data = {"train": str(folder / "data" / "train.parquet"), "test": str(folder / "data" / "test.parquet")}
    if build and not is_built():
        model, data = prepare(demo_plan, folder)
    demo = grpo_overrides(demo_plan, model, data, folder, device="auto")
    return [line for line in demo if not line.startswith(_DEMO_ONLY)]


def prepare(demo_plan: DemoPlan, folder: Path) -> tuple[str, dict[str, str]]:
    """Build the tiny model and the task's parquet files under `folder` with `hyflow.demos.runner`, SFT the model,
    and mark the folder complete; returns (the SFT'd model's folder, {"train": ..., "test": ...})."""
    from hyflow.demos.plot import DemoTable
    from hyflow.demos.runner import build_assets, run_sft_phase

    task = demo_plan.task
    logger.info("embedded default: building the tiny model and the %s task under %s (once; SFT first)", task, folder)
    folder.mkdir(parents=True, exist_ok=True)
    base_model, data = build_assets(demo_plan, folder)
    model = run_sft_phase(demo_plan, base_model, data, folder, DemoTable(phase="sft"))
    (folder / READY_MARKER).write_text(f"{task} {demo_plan.model_size} seed={demo_plan.seed}\n")
    return model, data
