"""Checkpoint bookkeeping: complete vs interrupted saves, the tracker, resume modes, pruning and RNG state."""

import random

import numpy as np
import pytest
import torch

from hyflow.trainer import checkpoint_manager as cm
from hyflow.trainer.checkpoint_manager import (
    TRACKER_FILE,
    TRAINER_STATE_FILE,
    StepCheckpoints,
    find_latest_checkpoint,
    resolve_resume_path,
    restore_rng_state,
)


def _save(manager: StepCheckpoints, step: int, roles=("actor",), **kwargs) -> None:
    path = manager.step_dir(step)
    for role in roles:  # what the workers would write
        (path / role).mkdir(exist_ok=True)
        (path / role / "model.pt").write_bytes(b"weights")
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

    def killed(obj, path):
        raise KeyboardInterrupt

    monkeypatch.setattr(cm, "_atomic_torch_save", killed)
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
