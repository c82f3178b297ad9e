"""A checkpoint save that fails (a full disk, simulated by a DCP writer that raises ENOSPC): one error naming the
folder, the free space and the fix; the failed save's files removed; the previous checkpoint kept and resumable."""

from __future__ import annotations

import errno
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint.filesystem as dcp_filesystem

from hyflow.algorithms.kl import FixedKLController
from hyflow.controller.errors import WorkerError
from hyflow.trainer.checkpoint_manager import StepCheckpoints
from hyflow.trainer.checkpoint_save import CheckpointSaveError, failed_save_reported, io_failure
from hyflow.trainer.ppo_checkpoint import save_ppo_checkpoint
from hyflow.workers.checkpoint import ShardCheckpointer


class ShardWriter:
    """A worker group's `save_checkpoint` in this process: the real sharded checkpointer on a tiny model."""

    def __init__(self) -> None:
        model = torch.nn.Linear(4, 4)
        self.shards = ShardCheckpointer(model, torch.optim.AdamW(model.parameters()))

    def save_checkpoint(self, local_path: str, global_step: int = 0) -> None:
        self.shards.save(local_path, info={"global_step": global_step})


class Loader:
    def state_dict(self) -> dict:
        return {"epoch": 0}


def _save(checkpoints: StepCheckpoints, step: int) -> None:
    workers = SimpleNamespace(actor_rollout=ShardWriter(), critic=None)
    save_ppo_checkpoint(checkpoints, workers, step, FixedKLController(0.0), Loader())


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_during_a_save_names_the_folder_the_free_space_and_the_fix_and_keeps_the_previous_one(
    tmp_path, monkeypatch
):
    checkpoints = StepCheckpoints(tmp_path)
    _save(checkpoints, 1)
    monkeypatch.setattr(dcp_filesystem, "_write_item", _disk_full)  # every shard write hits a full disk

    with pytest.raises(CheckpointSaveError) as caught:
        _save(checkpoints, 2)

    message = str(caught.value)
    free = shutil.disk_usage(tmp_path).free
    assert f"saving the checkpoint of step 2 into {tmp_path / 'global_step_2'} failed: " in message
    assert "OSError: [Errno 28] No space left on device" in message
    assert "Free space there: " in message and f"{free / 2**30:.1f} GiB" in message
    assert f"the last complete checkpoint is kept: {tmp_path / 'global_step_1'}" in message
    assert "Fix: free space on that disk, or point trainer.default_local_dir at a disk with room" in message
    assert "trainer.max_actor_ckpt_to_keep=N" in message
    assert not (tmp_path / "global_step_2").exists()
    assert not list(tmp_path.rglob("*.tmp"))
    assert checkpoints.resume("auto").global_step == 1


def test_a_full_disk_at_the_first_save_says_that_no_checkpoint_was_saved_before(tmp_path, monkeypatch):
    monkeypatch.setattr(dcp_filesystem, "_write_item", _disk_full)

    with pytest.raises(CheckpointSaveError, match="no complete checkpoint was saved before this one"):
        _save(StepCheckpoints(tmp_path), 1)

    assert list(tmp_path.iterdir()) == []


def test_a_failure_that_is_not_a_write_is_raised_unchanged_after_removing_the_unfinished_files(tmp_path):
    with pytest.raises(KeyError, match="a bug"), failed_save_reported(tmp_path, 3, keep_key="k"):
        (tmp_path / "global_step_3" / "actor.tmp").mkdir(parents=True)
        raise KeyError("a bug")

    assert list(tmp_path.iterdir()) == []


def test_torchs_unexpected_pos_error_of_a_cut_short_file_write_counts_as_a_failed_write():
    error = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598")

    assert io_failure(error).startswith("RuntimeError: [enforce fail at inline_container.cc:664] . unexpected pos")


def test_a_ray_workers_traceback_that_ends_in_an_os_error_counts_as_a_failed_write():
    traceback_text = (
        "Traceback (most recent call last):\n  File ...\n"
        "torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0])\n"
        "OSError: [Errno 28] No space left on device\n"
    )
    error = WorkerError(
        rank=0, method="save_checkpoint", remote_traceback=traceback_text, cause_type="CheckpointException"
    )

    assert io_failure(error) == "OSError: [Errno 28] No space left on device"
    assert io_failure(WorkerError(rank=0, method="m", remote_traceback="KeyError: 'x'", cause_type="KeyError")) is None
