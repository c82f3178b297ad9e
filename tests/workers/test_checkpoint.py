"""Checkpoints: save → load → next step equals not stopping; incomplete folders are refused untouched."""

import copy
import os
import re

import pytest
import torch

from hyflow.config.actor_rollout_ref import ActorConfig
from hyflow.models.loader import load_causal_lm
from hyflow.models.policy import PolicyModel
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.checkpoint import MARKER_FILE, ShardCheckpointer, read_checkpoint_info
from hyflow.workers.optim import build_lr_scheduler, build_optimizer


def make_actor_and_manager(path: str, seed: int = 0):
    config = ActorConfig(ppo_micro_batch_size_per_gpu=2)
    config.optim.lr = 1e-2
    config.optim.lr_warmup_steps = 3
    torch.manual_seed(seed)
    policy = PolicyModel(load_causal_lm(path))
    optimizer = build_optimizer(policy.parameters(), config.optim)
    scheduler = build_lr_scheduler(optimizer, config.optim)
    actor = DataParallelPPOActor(config, policy, optimizer, mini_batch_size=4)
    return actor, scheduler, ShardCheckpointer(policy, optimizer, scheduler)


def train_step(actor, scheduler, data):
    metrics = actor.update_policy(copy.deepcopy(data))
    scheduler.step()
    return metrics


def test_save_then_load_then_step_is_identical_to_not_stopping(tiny_model_path, ppo_batch, tmp_path):
    first, second = ppo_batch(batch_size=4, seed=1), ppo_batch(batch_size=4, seed=2)
    actor, scheduler, manager = make_actor_and_manager(tiny_model_path)
    train_step(actor, scheduler, first)
    manager.save(tmp_path / "ckpt", info={"global_step": 1})
    torch.manual_seed(123)  # the RNG state is restored by load
    expected_noise = torch.rand(3)
    expected_metrics = train_step(actor, scheduler, second)

    resumed, resumed_scheduler, resumed_manager = make_actor_and_manager(tiny_model_path, seed=7)
    assert read_checkpoint_info(tmp_path / "ckpt")["global_step"] == 1
    resumed_manager.load(tmp_path / "ckpt")
    assert resumed_scheduler.last_epoch == 1
    metrics = train_step(resumed, resumed_scheduler, second)
    assert metrics == expected_metrics
    for p, q in zip(actor.module.parameters(), resumed.module.parameters()):
        assert torch.equal(p, q)
    assert not torch.equal(torch.rand(3), expected_noise)  # RNG came back to the saved state, not seed 123


def test_saving_over_an_existing_checkpoint_replaces_it_atomically(tiny_model_path, tmp_path):
    _, _, manager = make_actor_and_manager(tiny_model_path)
    manager.save(tmp_path / "ckpt", info={"global_step": 1})
    manager.save(tmp_path / "ckpt", info={"global_step": 2})
    assert read_checkpoint_info(tmp_path / "ckpt")["global_step"] == 2
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_an_incomplete_checkpoint_is_a_clear_error_and_is_left_untouched(tiny_model_path, tmp_path):
    _, _, manager = make_actor_and_manager(tiny_model_path)
    manager.save(tmp_path / "ckpt")
    os.remove(tmp_path / "ckpt" / MARKER_FILE)
    before = sorted(os.listdir(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="incomplete"):
        manager.load(tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == before
    with pytest.raises(ValueError, match="does not exist"):
        manager.load(tmp_path / "nowhere")


@pytest.mark.parametrize("name", [".metadata", "__0_0.distcp"])
def test_a_truncated_shard_file_is_a_clear_error_naming_it(tiny_model_path, tmp_path, name):
    _, _, manager = make_actor_and_manager(tiny_model_path)
    manager.save(tmp_path / "ckpt")
    damaged = tmp_path / "ckpt" / "dcp" / name
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    shown = ".metadata" if name == ".metadata" else "a shard"
    with pytest.raises(
        ValueError, match=rf"checkpoint file .*{re.escape(shown)}.* is unreadable .*truncated or corrupt"
    ):
        manager.load(tmp_path / "ckpt")


def test_a_corrupt_marker_file_is_a_clear_error_naming_it(tiny_model_path, tmp_path):
    _, _, manager = make_actor_and_manager(tiny_model_path)
    manager.save(tmp_path / "ckpt")
    (tmp_path / "ckpt" / MARKER_FILE).write_text('{"format_version": 1, "wor')
    with pytest.raises(ValueError, match=rf"{MARKER_FILE} is corrupt"):
        manager.load(tmp_path / "ckpt")


def test_unknown_checkpoint_contents_are_rejected_with_the_allowed_list(tiny_model_path):
    actor, _, _ = make_actor_and_manager(tiny_model_path)
    with pytest.raises(ValueError, match="allowed"):
        ShardCheckpointer(actor.module, save_contents=["model", "weights"])
