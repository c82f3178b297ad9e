"""Shared set-up of the end-to-end trainer tests: a tiny model, the synthetic arith task, and a small config.

Every run is CPU-sized: 4 prompts × n=2 samples per step, responses of at most 8 tokens, 2 steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hyflow.config import PPOTrainerConfig, load_config
from hyflow.data.prepare import prepare_task
from hyflow.models.tiny import build_tiny_model
from hyflow.trainer.placement import ACTOR_ROLLOUT
from hyflow.trainer.ppo_trainer import PPOTrainer

# A small custom reward whose score varies with the response text, so the random tiny model gets non-zero
# advantages (the real arith scorer would give it 0 everywhere).
REWARD_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": (len(solution_str) % 5) / 4, "acc": float(str(ground_truth) in solution_str)}
"""


def build_assets(root: Path) -> dict[str, str]:
    """A tiny qwen2 model folder and arith train/test parquet files under `root`."""
    model = build_tiny_model(root / "model", arch="qwen2", hidden_size=32, num_layers=2, intermediate_size=64)
    data = prepare_task("arith", root / "data", seed=0, train_size=16, test_size=4, num_digits=1)
    return {"model": model, "train": data["train"], "val": data["test"]}


def build_assets_with_reward(root: Path) -> dict[str, str]:
    """`build_assets` plus `REWARD_FILE` written under `root` (key "reward": its path)."""
    found = build_assets(root)
    (root / "reward.py").write_text(REWARD_FILE)
    found["reward"] = str(root / "reward.py")
    return found


def tiny_overrides(assets: dict[str, str], out: Path) -> list[str]:
    """GRPO on the tiny model for 2 steps, local backend, everything written under `out`."""
    return [
        f"data.train_files={assets['train']}",
        f"data.val_files={assets['val']}",
        "data.train_batch_size=4",
        "data.max_prompt_length=48",
        "data.max_response_length=8",
        "data.shuffle=True",
        f"actor_rollout_ref.model.path={assets['model']}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.max_num_batched_tokens=256",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "critic.model.enable_gradient_checkpointing=False",
        "critic.optim.lr=1e-3",
        "algorithm.adv_estimator=grpo",
        "trainer.backend=local",
        "trainer.device=cpu",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        "trainer.project_name=tests",
        "trainer.experiment_name=tiny",
        f"trainer.default_local_dir={out / 'ckpt'}",
    ]


def tiny_config(assets: dict[str, str], out: Path, *extra: str) -> PPOTrainerConfig:
    return load_config([*tiny_overrides(assets, out), *extra])


def read_metrics(log_dir: Path) -> list[dict]:
    """The `file` logger's lines: [{"step": N, "data": {...}}, ...]."""
    with (log_dir / "metrics.jsonl").open() as f:
        return [json.loads(line) for line in f]


def train(assets: dict[str, str], out: Path, *overrides: str) -> tuple[list[dict], PPOTrainer, dict]:
    """Build, train and close a trainer with `REWARD_FILE`; returns (metrics of each logged step, trainer, initial
    actor weights)."""
    config = tiny_config(assets, out, f"custom_reward_function.path={assets['reward']}", *overrides)
    trainer = PPOTrainer(config)
    trainer.init_workers()
    before = actor_parameters(trainer)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return read_metrics(trainer.tracking.log_dir), trainer, before


def actor_parameters(trainer: PPOTrainer) -> dict[str, torch.Tensor]:
    """The local actor's full weights, cloned."""
    module = trainer.workers.local_role(ACTOR_ROLLOUT).actor.module
    return {name: p.detach().full_tensor().clone() for name, p in module.named_parameters()}
