"""Checkpoint bookkeeping: complete vs interrupted saves, the tracker, resume modes, pruning, RNG state, and the
checksum manifest that lets resuming find a damaged checkpoint and fall back to the previous one."""

import json
import logging
import random
import re

import numpy as np
import pytest
import torch

from hyflow.trainer import checkpoint_manager as cm
from hyflow.trainer.checkpoint_manager import (
    TRACKER_FILE,
    TRAINER_STATE_FILE,
    DamagedCheckpointError,
    StepCheckpoints,
    find_latest_checkpoint,
    resolve_resume_path,
    restore_rng_state,
)
from hyflow.trainer.checkpoint_manifest import MANIFEST_FILE


def _save(manager: StepCheckpoints, step: int, roles=("actor",), **kwargs) -> None:
    path = manager.step_dir(step)
    for role in roles:  # what the workers would write
        (path / role / "dcp").mkdir(parents=True, exist_ok=True)
        (path / role / "dcp" / "__0_0.distcp").write_bytes(b"weights of step %d" % step)
        (path / role / "dcp" / ".metadata").write_bytes(b"metadata of step %d" % step)
    manager.finalize(step, **kwargs)


def test_a_finalized_step_round_trips_its_trainer_state_and_updates_the_tracker(tmp_path):
    manager = StepCheckpoints(tmp_path)
    _save(manager, 10, dataloader_state={"epoch": 1, "samples_seen": 64}, extra={"kl_coef": 0.02})
    state = manager.resume("auto")
    assert state.global_step == 10
    assert state.dataloader_state == {"epoch": 1, "samples_seen": 64}
    assert state.extra == {"kl_coef": 0.02}
    assert state.path == tmp_path / "global_step_10"
    assert (tmp_path / TRACKER_FILE).read_text() == "10"
    assert not list(tmp_path.rglob("*.tmp"))


def test_latest_checkpoint_skips_a_save_that_was_interrupted(tmp_path):
    manager = StepCheckpoints(tmp_path)
    _save(manager, 10)
    _save(manager, 20)
    interrupted = manager.step_dir(30)
    (interrupted / "actor").mkdir()  # the workers started writing, then the run was killed
    assert find_latest_checkpoint(tmp_path) == tmp_path / "global_step_20"


def test_a_failure_while_writing_the_trainer_state_leaves_the_step_incomplete_and_the_tracker_unchanged(
    tmp_path, monkeypatch
):
    manager = StepCheckpoints(tmp_path)
    _save(manager, 10)
    manager.step_dir(20)

    real_write = cm.atomic_write_bytes

    def killed_at_the_trainer_state(data, path):
        if path.name == TRAINER_STATE_FILE:
            raise KeyboardInterrupt
        real_write(data, path)

    monkeypatch.setattr(cm, "atomic_write_bytes", killed_at_the_trainer_state)
    with pytest.raises(KeyboardInterrupt):
        manager.finalize(20)
    assert (tmp_path / TRACKER_FILE).read_text() == "10"
    assert find_latest_checkpoint(tmp_path) == tmp_path / "global_step_10"


def test_saving_a_step_again_marks_it_incomplete_until_finalized(tmp_path):
    manager = StepCheckpoints(tmp_path)
    _save(manager, 10)
    path = manager.step_dir(10)
    assert not (path / TRAINER_STATE_FILE).exists()
    manager.finalize(10)
    assert (path / TRAINER_STATE_FILE).exists()


def test_resume_modes_disable_and_auto_without_checkpoints_start_from_scratch(tmp_path):
    manager = StepCheckpoints(tmp_path)
    assert manager.resume("auto") is None
    _save(manager, 5)
    assert manager.resume("disable") is None


def test_resume_path_loads_the_named_step(tmp_path):
    manager = StepCheckpoints(tmp_path)
    _save(manager, 5)
    _save(manager, 6)
    assert manager.resume("resume_path", tmp_path / "global_step_5").global_step == 5


@pytest.mark.parametrize(
    ("mode", "path", "message"),
    [
        ("resume_path", None, "needs trainer.resume_from_path"),
        ("resume_path", "somewhere/step_3", "global_step_<N>"),
        ("resume_path", "global_step_7", "not a complete checkpoint"),
        ("latest", None, r"Allowed values: \['auto', 'disable', 'resume_path'\]"),
    ],
)
def test_bad_resume_settings_say_what_to_change(tmp_path, mode, path, message):
    with pytest.raises(ValueError, match=message):
        resolve_resume_path(tmp_path, mode, tmp_path / path if path else None)


def test_pruning_keeps_only_the_newest_actor_checkpoints(tmp_path):
    manager = StepCheckpoints(tmp_path, max_actor_ckpt_to_keep=2)
    for step in (1, 2, 3, 4):
        _save(manager, step)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_3", "global_step_4"]


def test_pruning_actor_and_critic_separately_leaves_older_steps_unresumable(tmp_path):
    manager = StepCheckpoints(tmp_path, max_actor_ckpt_to_keep=1, max_critic_ckpt_to_keep=2)
    for step in (1, 2, 3):
        _save(manager, step, roles=("actor", "critic"))
    assert not (tmp_path / "global_step_1").exists()
    kept_critic_only = tmp_path / "global_step_2"
    assert (kept_critic_only / "critic").is_dir() and not (kept_critic_only / "actor").exists()
    assert not (kept_critic_only / TRAINER_STATE_FILE).exists()
    assert find_latest_checkpoint(tmp_path) == tmp_path / "global_step_3"
    _save(manager, 4, roles=("actor", "critic"))
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_3", "global_step_4"]


def test_negative_keep_counts_are_rejected_with_the_key():
    with pytest.raises(ValueError, match=r"trainer\.max_critic_ckpt_to_keep=-1"):
        StepCheckpoints("x", max_critic_ckpt_to_keep=-1)


def test_the_controllers_rng_state_is_restored_on_resume(tmp_path):
    manager = StepCheckpoints(tmp_path)
    _save(manager, 1)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng_state(manager.resume("auto").rng_state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_a_finalized_step_has_a_manifest_with_the_size_and_checksum_of_every_file(tmp_path):
    manager = StepCheckpoints(tmp_path)
    _save(manager, 10)
    files = json.loads((tmp_path / "global_step_10" / MANIFEST_FILE).read_text())["files"]
    assert sorted(files) == ["actor/dcp/.metadata", "actor/dcp/__0_0.distcp", TRAINER_STATE_FILE]
    assert files["actor/dcp/__0_0.distcp"]["size"] == len(b"weights of step 10")
    assert files[TRAINER_STATE_FILE]["size"] == (tmp_path / "global_step_10" / TRAINER_STATE_FILE).stat().st_size


def truncate(path):
    path.write_bytes(path.read_bytes()[:-3])


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGES = [
    ("actor/dcp/__0_0.distcp", truncate, "truncated"),
    ("actor/dcp/.metadata", flip_a_byte, "corrupt: CRC-32"),
    (TRAINER_STATE_FILE, truncate, "truncated"),
    ("actor/dcp/.metadata", lambda path: path.unlink(), "missing"),
]


@pytest.mark.parametrize(("name", "damage", "fault"), DAMAGES)
def test_auto_resume_skips_a_damaged_latest_checkpoint_with_a_warning_naming_the_file(
    tmp_path, caplog, name, damage, fault
):
    manager = StepCheckpoints(tmp_path)
    _save(manager, 10)
    _save(manager, 20)
    damaged = tmp_path / "global_step_20" / name
    damage(damaged)

    with caplog.at_level(logging.WARNING, logger="hyflow.trainer.checkpoint_manager"):
        state = manager.resume("auto")

    assert state.global_step == 10  # the previous complete checkpoint, whole
    warning = caplog.text
    assert f"{damaged}: {fault}" in warning and "Falling back to the previous complete checkpoint" in warning


def test_resume_path_to_a_damaged_checkpoint_is_an_error_naming_the_file_and_the_fault(tmp_path):
    manager = StepCheckpoints(tmp_path)
    _save(manager, 10)
    shard = tmp_path / "global_step_10" / "actor" / "dcp" / "__0_0.distcp"
    truncate(shard)
    with pytest.raises(
        DamagedCheckpointError, match=re.escape(f"{shard}: truncated: 15 bytes, 18 were written")
    ) as caught:
        manager.resume("resume_path", tmp_path / "global_step_10")
    assert "trainer.resume_from_path" in str(caught.value)


def test_auto_resume_refuses_to_start_over_when_every_checkpoint_is_damaged(tmp_path):
    manager = StepCheckpoints(tmp_path)
    _save(manager, 10)
    _save(manager, 20)
    for step in (10, 20):
        flip_a_byte(tmp_path / f"global_step_{step}" / "actor" / "dcp" / ".metadata")
    with pytest.raises(DamagedCheckpointError, match=r"every complete checkpoint under .* is damaged") as caught:
        manager.resume("auto")
    assert len(caught.value.problems) == 2 and "trainer.resume_mode=disable" in str(caught.value)


def test_a_checkpoint_without_a_manifest_loads_and_an_unreadable_trainer_state_still_falls_back(tmp_path):
    manager = StepCheckpoints(tmp_path)
    _save(manager, 10)
    _save(manager, 20)
    for step in (10, 20):  # as an older hyflow wrote them
        (tmp_path / f"global_step_{step}" / MANIFEST_FILE).unlink()
    assert manager.resume("auto").global_step == 20
    truncate(tmp_path / "global_step_20" / TRAINER_STATE_FILE)
    assert manager.resume("auto").global_step == 10


def test_a_completed_save_leaves_no_tmp_files_of_interrupted_ones(tmp_path):
    manager = StepCheckpoints(tmp_path)
    path = manager.step_dir(20)
    (path / "actor.tmp" / "dcp").mkdir(parents=True)  # a worker save killed before its rename
    (path / f".{TRAINER_STATE_FILE}.k1ll.tmp").write_bytes(b"half")  # a kill inside the atomic write
    (tmp_path / f".{TRACKER_FILE}.k1ll.tmp").write_text("2")
    _save(manager, 20)
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert manager.resume("auto").global_step == 20


def test_an_unwritable_checkpoint_folder_is_reported_with_the_key_before_anything_runs(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    manager = StepCheckpoints(tmp_path / "a_file" / "ckpt")
    with pytest.raises(ValueError, match=r"trainer\.default_local_dir='.*a_file/ckpt' is not writable: Not a direct"):
        manager.ensure_writable()


def test_checking_a_new_checkpoint_folder_leaves_nothing_behind(tmp_path):
    StepCheckpoints(tmp_path / "new" / "ckpt").ensure_writable()
    (tmp_path / "old").mkdir()
    StepCheckpoints(tmp_path / "old").ensure_writable()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["old"]
