"""GRPO end to end on a tiny Qwen2-VL: images from the data through `rollout.name=hf`, the update and `hyflow merge`.

The launch mirrors a verl geo3k script (module and sizes changed, paths local): the shapes task stands in for
geo3k, with a reward that varies with the response so the random model gets non-zero advantages.
"""

import math

import pytest
import torch
from transformers import AutoModelForImageTextToText

from hyflow.config import load_config
from hyflow.data.prepare import prepare_task
from hyflow.models.processor import load_processor
from hyflow.models.tiny_vlm import build_tiny_vlm
from hyflow.trainer.placement import ACTOR_ROLLOUT, CRITIC
from hyflow.trainer.ppo_trainer import PPOTrainer
from hyflow.workers.merge import merge_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REWARD_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return (len(solution_str) % 5) / 4
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision")
    (root / "reward.py").write_text(REWARD_FILE)
    data = prepare_task("shapes", root / "data", train_size=8, test_size=2, question="color")
    return {"model": build_tiny_vlm(root / "model"), **data, "reward": str(root / "reward.py")}


def vision_overrides(assets, out, *extra):
    return [
        f"data.train_files={assets['train']}",
        f"data.val_files={assets['test']}",
        "data.image_key=images",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=6",
        f"actor_rollout_ref.model.path={assets['model']}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2",
        "algorithm.adv_estimator=grpo",
        f"custom_reward_function.path={assets['reward']}",
        "trainer.backend=local",
        "trainer.device=cpu",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=True",
        "trainer.test_freq=2",
        "trainer.save_freq=2",
        "trainer.logger=[]",
        f"trainer.default_local_dir={out / 'ckpt'}",
        *extra,
    ]


def weights(module):
    return {name: p.detach().full_tensor().clone() for name, p in module.named_parameters()}


def train(assets, out, *extra, critic=False):
    """Train; returns (last metrics, weights before, weights after) of the actor, or of the critic."""
    trainer = PPOTrainer(load_config(vision_overrides(assets, out, *extra)))
    trainer.init_workers()
    worker = trainer.workers.local_role(CRITIC if critic else ACTOR_ROLLOUT)
    module = worker.critic.module if critic else worker.actor.module
    before = weights(module)
    try:
        metrics = trainer.fit()
    finally:
        trainer.close()
    return metrics, before, weights(module)


def test_grpo_on_images_trains_the_vlm_and_merges_into_a_folder_that_loads(assets, tmp_path):
    metrics, before, after = train(assets, tmp_path, "actor_rollout_ref.actor.freeze_vision_tower=True")
    assert any(key.startswith("val-core/hyflow/shapes/") for key in metrics), sorted(metrics)
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert any("language_model" in name for name in changed)
    assert any(".visual.merger." in name for name in changed)
    assert not any(".visual.blocks." in name for name in changed)  # frozen vision encoder
    merged = merge_checkpoint(str(tmp_path / "ckpt" / "global_step_2" / "actor"), str(tmp_path / "merged"))
    model = AutoModelForImageTextToText.from_pretrained(merged)
    key = "lm.model.language_model.layers.0.mlp.down_proj.weight"
    torch.testing.assert_close(model.model.language_model.layers[0].mlp.down_proj.weight, after[key])
    assert load_processor(merged).image_processor.merge_size == 2


def test_grpo_on_images_with_lora_changes_only_the_adapters(assets, tmp_path):
    lora = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8"]
    _, before, after = train(assets, tmp_path, *lora, "trainer.save_freq=-1")
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all("lora_" in name for name in changed)


def test_ppo_with_a_vlm_critic_trains_both_on_the_images(assets, tmp_path):
    gae = ["algorithm.adv_estimator=gae", "critic.model.enable_gradient_checkpointing=False", "critic.optim.lr=1e-2"]
    gae += ["critic.ppo_micro_batch_size_per_gpu=4", "trainer.save_freq=-1"]
    metrics, before, after = train(assets, tmp_path, *gae, critic=True)
    assert math.isfinite(metrics["critic/vf_loss"])
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert "value_head.weight" in changed and any(".visual." in name for name in changed)  # it sees the images


def test_grpo_on_images_with_the_native_engine_rollout_trains_the_vlm(assets, tmp_path):
    overrides = [o for o in vision_overrides(assets, tmp_path) if not o.startswith("actor_rollout_ref.rollout.name=")]
    trainer = PPOTrainer(load_config([*overrides, "actor_rollout_ref.rollout.name=hyflow", "trainer.save_freq=-1"]))
    trainer.init_workers()
    worker = trainer.workers.local_role(ACTOR_ROLLOUT)
    assert type(worker.rollout).__name__ == "EngineRollout" and worker.rollout.engine.vision is not None
    before = weights(worker.actor.module)
    try:
        metrics = trainer.fit()
    finally:
        trainer.close()
    after = weights(worker.actor.module)
    assert math.isfinite(metrics["actor/pg_loss"]) and metrics["response_length/mean"] > 0
    assert any(".visual." in name and not torch.equal(before[name], after[name]) for name in before)
