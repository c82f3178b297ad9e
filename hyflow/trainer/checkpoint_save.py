"""What a checkpoint save that fails leaves behind and says: its own unfinished files are removed, the previous
checkpoints are kept, and a failed write (a full disk above all) is one error naming the folder, the free space
there, the cause and the fix.

    with failed_save_reported(checkpoints.root, step, keep_key="trainer.max_actor_ckpt_to_keep"):
        path = checkpoints.step_dir(step)
        ...                                   # the workers write their shards; then checkpoints.finalize(step, ...)

Without this, a full disk surfaces as whatever the writer happened to be doing: torch's `unexpected pos 704 vs 598`
(a `torch.save` whose zip writer was cut short), a `CheckpointException` of torch.distributed.checkpoint listing
ranks, or a worker's traceback on Ray, none of them naming the folder or the disk. `io_failure` recognises those
(an `OSError` anywhere in the chain, DCP's per-rank failures, torch's stream-writer message, the text of a Ray
worker's traceback) and `CheckpointSaveError` says what happened:

    saving the checkpoint of step 40 into /ckpt/global_step_40 failed: OSError: [Errno 28] No space left on device.
    Free space there: 12.0 MiB of 49.1 GiB (the last checkpoint takes 5.9 GiB). The unfinished files were removed;
    the last complete checkpoint is kept: /ckpt/global_step_30. Fix: ...

Any other failure (a bug) is re-raised unchanged, after the same clean-up: its traceback is what helps there.
Clean-up removes the step folder of the failed save when it is incomplete (no `trainer_state.pt`: nothing can
resume from it) and the `*.tmp` debris of atomic writes in `trainer.default_local_dir`; complete step folders are
never touched.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from torch.distributed.checkpoint.api import CheckpointException

from hyflow.controller.errors import WorkerError
from hyflow.trainer.checkpoint_manager import complete_checkpoints, is_complete
from hyflow.trainer.checkpoint_manifest import remove_leftovers

__all__ = ["CheckpointSaveError", "failed_save_reported", "io_failure", "remove_failed_save"]

logger = logging.getLogger(__name__)

# What a failed write says when the error type alone does not (torch.save's zip writer, a Ray worker's traceback).
WRITE_FAILURE_TEXT = ("No space left on device", "Disk quota exceeded", "unexpected pos", "PytorchStreamWriter")
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): .*")  # "module.KeyError: 'x'" -> KeyError
OS_ERROR_NAMES = {name for name, obj in vars(builtins).items() if isinstance(obj, type) and issubclass(obj, OSError)}


class CheckpointSaveError(ValueError):
    """A checkpoint could not be written (disk full, quota, permissions, I/O); the message names the folder, the
    free space, the cause and the fix. A ValueError, like every error a user fixes by changing the set-up."""


def _dcp_failures(error: CheckpointException) -> list[BaseException]:
    """The exceptions of each failed rank of a torch.distributed.checkpoint call ({rank: (exception, frames)})."""
    found = []
    for failure in (getattr(error, "failures", None) or {}).values():
        found.append(failure[0] if isinstance(failure, tuple) else failure)
    return [failure for failure in found if isinstance(failure, BaseException)]


def _worker_io_failure(error: WorkerError) -> str | None:
    """The error line of a worker's traceback (a Ray worker's exception arrives as text) when it is a failed write."""
    text = error.remote_traceback
    lines = [line.strip() for line in text.splitlines() if _ERROR_LINE.match(line.strip())]
    names = {error.cause_type, *(_ERROR_LINE.match(line).group(1) for line in lines)}
    if names & OS_ERROR_NAMES or any(marker in text for marker in WRITE_FAILURE_TEXT):
        return lines[-1] if lines else error.cause_type
    return None


def io_failure(error: BaseException) -> str | None:
    """One line saying how a write failed, when `error` is (or was caused by) a failed write: an `OSError`, one rank's
    failure inside DCP's `CheckpointException`, torch's stream-writer error, or a worker's traceback showing one of
    these. None for any other error."""
    pending: list[BaseException | None] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError):
            return f"{type(current).__name__}: {current}"
        if isinstance(current, CheckpointException):
            pending.extend(_dcp_failures(current))
        elif isinstance(current, WorkerError):
            found = _worker_io_failure(current)
            if found is not None:
                return found
        elif isinstance(current, RuntimeError) and any(marker in str(current) for marker in WRITE_FAILURE_TEXT):
            first = (str(current).strip().splitlines() or [""])[0]
            return f"{type(current).__name__}: {first} (torch's writer could not write the whole file)"
        pending.extend([current.__cause__, current.__context__])
    return None


def _human(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if num_bytes < 1024:
            return f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} GiB"


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def remove_failed_save(root: Path, step: int) -> None:
    """Remove what a failed save of `step` left: its step folder when incomplete, and `*.tmp` debris under `root`
    (a complete step folder only loses its own `*.tmp` files)."""
    step_path = root / f"global_step_{step}"
    if step_path.is_dir():
        if is_complete(step_path):
            remove_leftovers(step_path, recursive=True)
        else:
            shutil.rmtree(step_path, ignore_errors=True)
    if root.is_dir():
        remove_leftovers(root, recursive=False)


def save_failure_message(root: Path, step: int, cause: str, keep_key: str) -> str:
    """The error of a failed write of step `step` under `root` (module docstring); call it after the clean-up."""
    step_path = root / f"global_step_{step}"
    usage = shutil.disk_usage(root if root.is_dir() else next(p for p in root.parents if p.is_dir()))
    complete = complete_checkpoints(root)
    size = f" (the last checkpoint takes {_human(_folder_bytes(complete[0]))})" if complete else ""
    kept = (
        f"the last complete checkpoint is kept: {complete[0]}"
        if complete
        else "no complete checkpoint was saved before this one"
    )
    return (
        f"saving the checkpoint of step {step} into {step_path} failed: {cause}. Free space there: "
        f"{_human(usage.free)} of {_human(usage.total)}{size}. The unfinished files were removed; {kept}. Fix: free "
        f"space on that disk, or point trainer.default_local_dir at a disk with room for a checkpoint, or keep fewer "
        f"({keep_key}=N); then start the run again: trainer.resume_mode=auto continues from the last complete "
        "checkpoint."
    )


@contextlib.contextmanager
def failed_save_reported(root: str | Path, step: int, keep_key: str) -> Iterator[None]:
    """Run a save of `step` under `root`; on failure remove its unfinished files and raise `CheckpointSaveError` for
    a failed write (`io_failure`), or re-raise any other error unchanged. `keep_key` names the config key that keeps
    fewer checkpoints (the fix the message offers)."""
    root = Path(root)
    try:
        yield
    except (Exception, CheckpointException) as error:  # DCP's CheckpointException derives from BaseException
        remove_failed_save(root, step)
        cause = io_failure(error)
        if cause is None:
            logger.error("the save of step %d under %s failed; its unfinished files were removed", step, root)
            raise
        raise CheckpointSaveError(save_failure_message(root, step, cause, keep_key)) from error
