"""GRPO on a tiny mixture-of-experts model: the engine generates it natively, its recorded log-probs equal the
training forward's, and the update moves the experts and the router."""

from __future__ import annotations

import math

import pytest
import torch

from hyflow.data.prepare import prepare_task
from hyflow.models.tiny import build_tiny_model
from hyflow.trainer.placement import ACTOR_ROLLOUT
from hyflow.trainer.ppo_trainer import PPOTrainer

from .ppo_testkit import REWARD_FILE, actor_parameters, tiny_config


@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_grpo_on_a_tiny_moe_model_trains_its_experts_from_the_engines_exact_log_probs(tmp_path, arch):
    model = build_tiny_model(tmp_path / "model", arch=arch, hidden_size=32, num_layers=2, intermediate_size=64)
    data = prepare_task("arith", tmp_path / "data", seed=0, train_size=8, test_size=4, num_digits=1)
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    assets = {"model": model, "train": data["train"], "val": data["test"]}
    config = tiny_config(
        assets,
        tmp_path,
        f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "actor_rollout_ref.rollout.name=hyflow",
        "actor_rollout_ref.actor.recompute_old_log_prob=True",
        "trainer.total_training_steps=1",
        "trainer.logger=[]",
    )
    trainer = PPOTrainer(config)
    trainer.init_workers()
    before = actor_parameters(trainer)
    try:
        engine_model = trainer.workers.local_role(ACTOR_ROLLOUT).rollout.engine.model
        assert engine_model.args.moe is not None  # the native engine, not the transformers.generate fallback
        metrics = trainer.fit()
        after = actor_parameters(trainer)
    finally:
        trainer.close()
    assert math.isfinite(metrics["actor/pg_loss"])
    assert metrics["training/rollout_probs_diff_max"] < 1e-4  # fp32 on the CPU: both sides route alike
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    assert any("experts" in name for name in moved) and any(".gate." in name for name in moved)
