"""GRPO on a tiny mixture-of-experts model with routing replay: R3 carries the engine's routing record to every
training forward of the batch, R2 the old-log-prob pass's own routing to the update."""

from __future__ import annotations

import math

import pytest

from hyflow import fields as F
from hyflow.data.prepare import prepare_task
from hyflow.models.tiny import build_tiny_model
from hyflow.trainer.placement import ACTOR_ROLLOUT
from hyflow.trainer.ppo_trainer import PPOTrainer

from .ppo_testkit import REWARD_FILE, tiny_config


def _capture_updates(worker) -> list:
    """The batches the actor's update receives."""
    batches, update = [], worker.actor.update_policy

    def capture(data, *args, **kwargs):
        batches.append(data)
        return update(data, *args, **kwargs)

    worker.actor.update_policy = capture
    return batches


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["R3", "R2"])
def test_grpo_with_routing_replay_trains_a_tiny_moe_from_the_replayed_routing(tmp_path, mode):
    model = build_tiny_model(tmp_path / "model", arch="qwen3_moe", hidden_size=32, num_layers=2, intermediate_size=64)
    data = prepare_task("arith", tmp_path / "data", seed=0, train_size=8, test_size=4, num_digits=1)
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    assets = {"model": model, "train": data["train"], "val": data["test"]}
    config = tiny_config(
        assets,
        tmp_path,
        f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "actor_rollout_ref.rollout.name=hyflow",
        "actor_rollout_ref.actor.recompute_old_log_prob=True",
        f"actor_rollout_ref.actor.router_replay.mode={mode}",
        "trainer.total_training_steps=1",
        "trainer.logger=[]",
    )
    trainer = PPOTrainer(config)
    trainer.init_workers()
    try:
        worker = trainer.workers.local_role(ACTOR_ROLLOUT)
        assert worker.rollout.engine.config.record_routing == (mode == "R3")
        batches = _capture_updates(worker)
        metrics = trainer.fit()
        replay = worker.actor.module._router_replay
    finally:
        trainer.close()
    assert math.isfinite(metrics["actor/pg_loss"])
    (batch,) = batches
    routed = batch.batch[F.ROUTED_EXPERTS]
    assert routed.shape[:2] == batch.batch[F.INPUT_IDS].shape and routed.shape[2:] == (2, 2)  # 2 MoE layers, top-2
    real = batch.batch[F.ATTENTION_MASK].bool()
    recorded = (routed != 255).all(-1).all(-1)
    assert not recorded[~real].any()  # padding has no record
    # R3: every token but each row's last went through the engine; R2: the trainer routed every real token
    missing = 1 if mode == "R3" else 0
    assert (recorded.sum(-1) == real.sum(-1) - missing).all()
    assert replay.mode == "replay" and len(replay.routers) == 2
    if mode == "R3":
        assert metrics["training/rollout_probs_diff_max"] < 1e-4  # fp32 on the CPU: the replay changes nothing
