"""A launch line in verl's style (the keys of verl's GRPO example scripts, vLLM rollout, FSDP offload, its logger
list), with local paths and shrunk sizes, trains on the CPU with only the module name changed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.process_kit import shell_env
from tests.trainer.ppo_testkit import build_assets, read_metrics


def verl_grpo_launch(assets: dict[str, str]) -> list[str]:
    """What a verl user's GRPO script passes to `python3 -m verl.trainer.main_ppo`, sizes shrunk for a tiny model."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={assets['train']}",
        f"data.val_files={assets['val']}",
        "data.train_batch_size=4",
        "data.max_prompt_length=48",
        "data.max_response_length=8",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        f"actor_rollout_ref.model.path={assets['model']}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.enable_chunked_prefill=True",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.logger=['console','file']",
        "trainer.project_name=verl_grpo_example_gsm8k",
        "trainer.experiment_name=tiny_cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=1",
        "trainer.total_epochs=1",
        "trainer.total_training_steps=2",
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_verl_style_grpo_launch_line_trains_on_the_cpu_with_the_module_name_changed(tmp_path):
    assets = build_assets(tmp_path)
    command = [sys.executable, "-m", "hyflow.trainer.main_ppo", *verl_grpo_launch(assets)]
    env = shell_env() | {"CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = read_metrics(tmp_path / "logs" / "verl_grpo_example_gsm8k" / "tiny_cpu")
    assert [line["step"] for line in steps if "actor/pg_loss" in line["data"]] == [1, 2]
    assert not (tmp_path / "checkpoints").exists()  # save_freq=-1: no checkpoints, as in verl
