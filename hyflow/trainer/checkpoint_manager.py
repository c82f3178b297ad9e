"""The controller's checkpoint bookkeeping: step folders, the latest-step tracker, resuming and pruning.

Layout under `trainer.default_local_dir` (verl's):

    global_step_40/
        actor/                           written by the actor workers (model, optimizer, scheduler shards)
        critic/                          written by the critic workers, when there is a critic
        checksums.json                   size and CRC-32 of every file above and of trainer_state.pt
        trainer_state.pt                 step, dataloader position, RNG states; written last, atomically
    latest_checkpointed_iteration.txt    "40"; rewritten atomically after trainer_state.pt

A save runs: `path = manager.step_dir(step)` → the workers write their shards into `path/actor` and
`path/critic` (blocking calls) → `manager.finalize(step, dataloader_state)`, which writes the checksum manifest
(checkpoint_manifest.py), `trainer_state.pt` (each a temporary file + `os.replace`), then the tracker, removes the
`*.tmp` debris of interrupted saves and prunes old checkpoints. A step folder counts as complete only once its
`trainer_state.pt` exists, so a run killed at any moment resumes from the last complete step.

Resuming checks a complete step's files against its manifest before anything is loaded. With `resume_mode=auto`
a damaged latest checkpoint (a truncated shard, a corrupt `.metadata` or `trainer_state.pt`) is skipped with a
warning naming the file and the fault, and the previous complete one is used; with `resume_path` it is an error.

    manager = StepCheckpoints(cfg.trainer.default_local_dir, cfg.trainer.max_actor_ckpt_to_keep,
                                cfg.trainer.max_critic_ckpt_to_keep)
    state = manager.resume(cfg.trainer.resume_mode, cfg.trainer.resume_from_path)   # None: start from scratch
    if state is not None:
        load_workers(state.path); loader.load_state_dict(state.dataloader_state); step = state.global_step
"""

from __future__ import annotations

import io
import logging
import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hyflow.trainer.checkpoint_manifest import (
    MANIFEST_FILE,
    manifest_bytes,
    manifest_entries,
    remove_leftovers,
    verify_manifest,
)

__all__ = [
    "ACTOR_DIR",
    "CRITIC_DIR",
    "RESUME_MODES",
    "TRACKER_FILE",
    "TRAINER_STATE_FILE",
    "DamagedCheckpointError",
    "StepCheckpoints",
    "TrainerState",
    "find_latest_checkpoint",
    "global_step_of",
    "is_complete",
    "resolve_resume_path",
    "restore_rng_state",
]

logger = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
TRAINER_STATE_FILE = "trainer_state.pt"
ACTOR_DIR = "actor"
CRITIC_DIR = "critic"
RESUME_MODES = ("auto", "disable", "resume_path")
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


@dataclass
class TrainerState:
    """What the controller needs to continue a run, besides the workers' shards."""

    global_step: int
    dataloader_state: dict[str, Any] | None = None
    rng_state: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the adaptive KL coefficient
    path: Path | None = None  # the step folder it was loaded from


def global_step_of(path: str | os.PathLike) -> int:
    """N of a `.../global_step_N` folder; ValueError for any other name."""
    match = _STEP_DIR.match(Path(path).name)
    if match is None:
        raise ValueError(
            f"trainer.resume_from_path={str(path)!r} is not a checkpoint folder: its name must be global_step_<N> "
            f"(a folder under trainer.default_local_dir)."
        )
    return int(match.group(1))


def is_complete(step_path: str | os.PathLike) -> bool:
    """Whether a step folder finished saving (its `trainer_state.pt`, written last, exists)."""
    return (Path(step_path) / TRAINER_STATE_FILE).is_file()


def _step_dirs(root: Path) -> dict[int, Path]:
    """Every global_step_N folder under `root`, by N."""
    if not root.is_dir():
        return {}
    found = {}
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found[int(match.group(1))] = child
    return found


def complete_checkpoints(root: str | os.PathLike) -> list[Path]:
    """The complete step folders under `root`, newest first (interrupted saves are left out)."""
    steps = _step_dirs(Path(root))
    return [steps[step] for step in sorted(steps, reverse=True) if is_complete(steps[step])]


def find_latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The complete step folder with the highest step under `root`, or None.

    Incomplete folders (a save that was interrupted) are skipped. The tracker file is only cross-checked: when
    it names a different step, a warning says so and the folders win.
    """
    root = Path(root)
    found = complete_checkpoints(root)
    latest = global_step_of(found[0]) if found else None
    tracker = root / TRACKER_FILE
    if tracker.is_file():
        recorded = tracker.read_text().strip()
        if recorded != str(latest):
            logger.warning("%s says step %s but the latest complete checkpoint is %s", tracker, recorded, latest)
    return found[0] if found else None


def resolve_resume_path(
    root: str | os.PathLike, resume_mode: str, resume_from_path: str | os.PathLike | None = None
) -> Path | None:
    """The step folder to resume from, or None to start from scratch.

    - `disable`: None.
    - `auto`: the latest complete checkpoint under `root` (None when there is none).
    - `resume_path`: `resume_from_path`, which must be a complete `global_step_<N>` folder.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        path = find_latest_checkpoint(root)
        if path is None:
            logger.info("no complete checkpoint under %s; training from scratch", root)
        return path
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise ValueError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_<N> folder); it is "
                "not set. Set it, or use trainer.resume_mode=auto."
            )
        path = Path(resume_from_path)
        global_step_of(path)
        if not is_complete(path):
            raise ValueError(
                f"trainer.resume_from_path={str(path)!r} is not a complete checkpoint (no {TRAINER_STATE_FILE}: "
                f"the folder is missing or its save was interrupted). Point it at an earlier global_step_<N> "
                f"folder, or use trainer.resume_mode=auto to pick the latest complete one."
            )
        return path
    raise ValueError(f"trainer.resume_mode={resume_mode!r} is not supported. Allowed values: {list(RESUME_MODES)}.")


def atomic_write_bytes(data: bytes, path: Path) -> None:
    """Write `data` to a temporary file in the same folder, fsync, then os.replace it onto `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _torch_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


class DamagedCheckpointError(ValueError):
    """A complete step folder whose files do not match what was written; `problems` names each file and fault."""

    def __init__(self, path: Path, problems: list[str], fix: str, headline: str | None = None) -> None:
        listing = "\n".join(f"  - {problem}" for problem in problems)
        headline = headline or f"checkpoint {path} is damaged; nothing was loaded from it"
        super().__init__(f"{headline}:\n{listing}\n{fix}")
        self.path = path
        self.problems = problems


def _capture_rng_state() -> dict[str, Any]:
    """The controller's Python, numpy and torch CPU RNG states, as plain types (loadable with weights_only)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), position, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }


def restore_rng_state(rng_state: dict[str, Any]) -> None:
    """Put back the RNG states captured when the checkpoint was written."""
    random.setstate(rng_state["python"])
    kind, keys, position, has_gauss, cached = rng_state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(rng_state["torch"])


class StepCheckpoints:
    """Step folders under `root`, the tracker, resuming and pruning (module docstring).

    `max_actor_ckpt_to_keep` / `max_critic_ckpt_to_keep`: how many of the newest `actor/` and `critic/` folders to
    keep (None or 0: all). A step folder that loses either one is no longer resumable, so its `trainer_state.pt`
    is removed first; a folder left with neither is deleted.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        max_actor_ckpt_to_keep: int | None = None,
        max_critic_ckpt_to_keep: int | None = None,
    ) -> None:
        for key, value in [
            ("max_actor_ckpt_to_keep", max_actor_ckpt_to_keep),
            ("max_critic_ckpt_to_keep", max_critic_ckpt_to_keep),
        ]:
            if value is not None and value < 0:
                raise ValueError(f"trainer.{key}={value}: must be None or 0 (keep all) or a positive count.")
        self.root = Path(root)
        self.max_to_keep = {ACTOR_DIR: max_actor_ckpt_to_keep or None, CRITIC_DIR: max_critic_ckpt_to_keep or None}

    def ensure_writable(self) -> None:
        """Create `root` and a probe file in it, then remove what the probe made, so an unwritable
        `trainer.default_local_dir` is found at start-up (a clear ValueError), not when the first checkpoint is due."""
        missing = [folder for folder in (self.root, *self.root.parents) if not folder.exists()]
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".write_probe.", suffix=".tmp"):
                pass
            for folder in missing:  # deepest first; the first save creates them again
                folder.rmdir()
        except OSError as error:
            reason = error.strerror or type(error).__name__
            raise ValueError(
                f"trainer.default_local_dir={str(self.root)!r} is not writable: {reason} "
                f"({error.filename or self.root}). Checkpoints are saved there (every trainer.save_freq steps and "
                "at the end). Fix: point trainer.default_local_dir at a folder this user can create and write, or "
                "fix its permissions."
            ) from None

    def step_dir(self, step: int) -> Path:
        """Create (or reopen) `global_step_<step>` for the workers to write into; it reads as incomplete until
        `finalize(step, ...)`."""
        path = self.root / f"global_step_{step}"
        path.mkdir(parents=True, exist_ok=True)
        (path / TRAINER_STATE_FILE).unlink(missing_ok=True)  # re-saving a step: incomplete until finalized
        return path

    def finalize(
        self,
        step: int,
        dataloader_state: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Mark step `step` complete: the checksum manifest, `trainer_state.pt` and the tracker (each atomically),
        then remove the debris of interrupted saves and prune.

        Call it after the workers have written their shards. `extra` holds plain values (numbers, strings, lists,
        dicts, tensors) such as the adaptive KL coefficient.
        """
        path = self.root / f"global_step_{step}"
        if not path.is_dir():
            raise FileNotFoundError(f"{path} does not exist; call step_dir({step}) before the workers save into it.")
        state = {
            "global_step": step,
            "dataloader_state": dataloader_state,
            "rng_state": _capture_rng_state(),
            "extra": dict(extra or {}),
        }
        state_bytes = _torch_bytes(state)
        entries = manifest_entries(path, extra={TRAINER_STATE_FILE: state_bytes})
        atomic_write_bytes(manifest_bytes(entries), path / MANIFEST_FILE)
        atomic_write_bytes(state_bytes, path / TRAINER_STATE_FILE)
        atomic_write_bytes(str(step).encode(), self.root / TRACKER_FILE)
        remove_leftovers(path, recursive=True)
        remove_leftovers(self.root, recursive=False)
        logger.info("checkpoint complete: %s", path)
        self.prune()
        return path

    def load(self, path: str | os.PathLike) -> TrainerState:
        """The trainer state saved in a step folder (its files unchecked: `resume` checks them first)."""
        path = Path(path)
        # weights_only: the state holds only plain types and tensors
        raw = torch.load(path / TRAINER_STATE_FILE, map_location="cpu", weights_only=True)
        return TrainerState(
            global_step=int(raw["global_step"]),
            dataloader_state=raw["dataloader_state"],
            rng_state=raw["rng_state"],
            extra=raw["extra"],
            path=path,
        )

    def load_checked(self, path: Path, fix: str) -> TrainerState:
        """`load` after checking every file of `path` against its manifest; DamagedCheckpointError (with `fix`)
        naming each damaged file. A folder without a manifest (an older hyflow) is loaded with a warning."""
        problems = verify_manifest(path)
        if problems is None:
            logger.warning("%s has no %s (an older hyflow saved it): its files are not checked", path, MANIFEST_FILE)
        elif problems:
            raise DamagedCheckpointError(path, problems, fix)
        try:
            return self.load(path)
        except Exception as error:  # e.g. a legacy folder with a truncated trainer_state.pt
            problem = f"{path / TRAINER_STATE_FILE}: unreadable ({type(error).__name__}: {error})"
            raise DamagedCheckpointError(path, [problem], fix) from None

    def resume(self, resume_mode: str, resume_from_path: str | os.PathLike | None = None) -> TrainerState | None:
        """The trainer state to continue from (`resolve_resume_path` says which folder), its files checked first.

        `auto` walks the complete checkpoints newest first and skips damaged ones with a warning; when every one
        is damaged it raises rather than start from scratch over them. `resume_path` raises for a damaged folder.
        """
        if resume_mode == "auto":
            state = self._latest_sound()
        else:
            path = resolve_resume_path(self.root, resume_mode, resume_from_path)
            fix = "Restore the named files, or point trainer.resume_from_path at an earlier global_step_<N> folder."
            state = None if path is None else self.load_checked(path, fix)
        if state is not None:
            logger.info("resuming from %s (step %d)", state.path, state.global_step)
        return state

    def _latest_sound(self) -> TrainerState | None:
        find_latest_checkpoint(self.root)  # cross-checks the tracker
        damaged: list[DamagedCheckpointError] = []
        for path in complete_checkpoints(self.root):
            try:
                return self.load_checked(path, "Falling back to the previous complete checkpoint.")
            except DamagedCheckpointError as error:
                logger.warning("%s", error)
                damaged.append(error)
        if not damaged:
            logger.info("no complete checkpoint under %s; training from scratch", self.root)
            return None
        problems = [problem for error in damaged for problem in error.problems]
        raise DamagedCheckpointError(
            self.root,
            problems,
            "Fix: restore the named files, or move the folders away (or set trainer.resume_mode=disable) to train "
            "from scratch.",
            headline=f"every complete checkpoint under {self.root} is damaged, so nothing was resumed",
        )

    def prune(self) -> None:
        """Delete `actor/` and `critic/` folders beyond the newest `max_*_ckpt_to_keep` (module docstring).

        Only steps up to the newest complete one are considered, so a save in progress is never touched.
        """
        steps = _step_dirs(self.root)
        complete = [step for step, path in steps.items() if is_complete(path)]
        if not complete:
            return
        saved = sorted((step for step in steps if step <= max(complete)), reverse=True)
        for role, max_keep in self.max_to_keep.items():
            if max_keep is None:
                continue
            with_role = [step for step in saved if (steps[step] / role).is_dir()]
            for step in with_role[max_keep:]:
                (steps[step] / TRAINER_STATE_FILE).unlink(missing_ok=True)  # first: no longer resumable
                shutil.rmtree(steps[step] / role)
                logger.info("pruned %s", steps[step] / role)
        for step in saved:
            path = steps[step]
            if not is_complete(path) and not any((path / role).is_dir() for role in self.max_to_keep):
                shutil.rmtree(path)
