"""GRPO on video prompts end to end on a tiny Qwen2.5-VL with hyflow's engine as the rollout: the engine's
time-scaled M-RoPE positions (tokens_per_second x second_per_grid_ts) are the ones the actor trains with, so the
engine's log-probs equal the actor's."""

import io
import math

import pytest
from PIL import Image
from transformers import AutoModelForImageTextToText

from hyflow.config import load_config
from hyflow.data.prepare import write_parquet
from hyflow.models.tiny import peak_weights
from hyflow.models.tiny_vlm import build_tiny_vlm
from hyflow.trainer.ppo_trainer import PPOTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REWARD_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return (len(solution_str) % 5) / 4
"""
COLORS = ["red", "green", "blue", "yellow"]


def png(color: str) -> dict:
    buffer = io.BytesIO()
    Image.new("RGB", (56, 56), color).save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def video_rows(num_rows: int) -> list[dict]:
    """Clips of 2-4 coloured frames at 1 or 2 frames per second (verl's {"video": frames, "fps": ...} form)."""
    return [
        {
            "data_source": "clips",
            "prompt": [{"role": "user", "content": "<video>Which colour comes last?"}],
            "videos": [{"video": [png(c) for c in COLORS[: 2 + i % 3]], "fps": 1.0 + i % 2}],
            "reward_model": {"style": "rule", "ground_truth": COLORS[1 + i % 3]},
        }
        for i in range(num_rows)
    ]


def peaked_tiny_qwen25_vl(folder) -> str:
    """The tiny Qwen2.5-VL with larger random weights, so its next-token distributions depend on the positions."""
    path = build_tiny_vlm(folder, arch="qwen2_5_vl")
    peak_weights(AutoModelForImageTextToText.from_pretrained(path)).save_pretrained(path)
    return path


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_grpo_on_qwen25_vl_videos_with_the_engine_rollout_matches_the_actors_log_probs(tmp_path):
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    write_parquet(video_rows(4), str(tmp_path / "train.parquet"))
    model = peaked_tiny_qwen25_vl(tmp_path / "model")
    overrides = [
        f"data.train_files={tmp_path / 'train.parquet'}",
        "data.video_key=videos",
        "data.train_batch_size=4",
        "data.max_prompt_length=48",
        "data.max_response_length=6",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.recompute_old_log_prob=True",
        "actor_rollout_ref.rollout.name=hyflow",
        "actor_rollout_ref.rollout.n=2",
        "algorithm.adv_estimator=grpo",
        f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "trainer.backend=local",
        "trainer.device=cpu",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[]",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]
    trainer = PPOTrainer(load_config(overrides))
    trainer.init_workers()
    try:
        metrics = trainer.fit()
    finally:
        trainer.close()
    assert math.isfinite(metrics["actor/pg_loss"]) and metrics["response_length/mean"] > 0
    assert metrics["training/rollout_probs_diff_max"] < 1e-4  # fp32 on the CPU: the same positions on both sides
