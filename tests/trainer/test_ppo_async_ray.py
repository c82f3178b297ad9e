"""The asynchronous modes end to end on the Ray backend, CPU: one training and one rollout worker (split
placement), the weights sent over the gloo weight channel after each update.

On-policy settings reproduce the colocated synchronous run exactly; one-step off-policy trains batch k+1 with the
weights of step k−1; the fully asynchronous mode keeps every trained sample within `max_staleness` of the weights
it updates even when the trainer is slow; a resumed run continues from the loader position of its last trained
batch.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
import torch

from hyflow.trainer.checkpoint_manager import TRAINER_STATE_FILE
from hyflow.trainer.ppo_trainer import PPOTrainer
from tests.trainer.ppo_testkit import build_assets_with_reward, read_metrics, tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

RAY = ["trainer.backend=ray", "trainer.ray_init.num_cpus=2"]
SPLIT = [*RAY, "trainer.placement=split"]
VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/", "async/", "rollout/weight_")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_assets_with_reward(tmp_path_factory.mktemp("async_assets"))


def run(assets, out: Path, *overrides: str, slow_train_s: float = 0.0) -> list[dict]:
    """Train in `out`; returns each logged step's metrics. `slow_train_s` makes every training step that slower."""
    config = tiny_config(assets, out, f"custom_reward_function.path={assets['reward']}", *overrides)
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(out):
        trainer = PPOTrainer(config)
        if slow_train_s:
            train_step = trainer.train_step

            def slow_train_step(batch, timing):
                time.sleep(slow_train_s)  # a deliberately slow trainer: the rollout pool runs ahead to the bound
                return train_step(batch, timing)

            trainer.train_step = slow_train_step
        trainer.init_workers()
        try:
            trainer.fit()
        finally:
            trainer.close()
        return [step["data"] for step in read_metrics(trainer.tracking.log_dir)]


def comparable(steps: list[dict]) -> list[dict]:
    """The metrics that do not depend on the wall clock or the placement, per step."""
    return [{k: v for k, v in step.items() if not k.startswith(VOLATILE) and "weight_sync" not in k} for step in steps]


@pytest.fixture(scope="module")
def colocated(ray_started_here, assets, tmp_path_factory):
    """The synchronous reference: every role on one Ray worker, 3 steps."""
    return run(assets, tmp_path_factory.mktemp("colocated"), *RAY, "trainer.total_training_steps=3")


def test_split_placement_on_policy_reproduces_the_colocated_run_exactly(colocated, assets, tmp_path):
    split = run(assets, tmp_path, *SPLIT, "trainer.total_training_steps=3")

    assert comparable(split) == comparable(colocated)
    assert {"actor/pg_loss", "critic/score/mean", "response_length/mean"} <= set(comparable(split)[-1])
    assert all(step["rollout/weight_transfer_gb"] > 0 and "timing_s/weight_transfer" in step for step in split)
    assert all(step["async/staleness_max"] == 0 for step in split)


@pytest.mark.slow
def test_fully_async_with_staleness_0_reproduces_the_synchronous_run_exactly(colocated, assets, tmp_path):
    on_policy = ["async_training.mode=fully_async", "async_training.max_staleness=0", "async_training.chunk_prompts=4"]
    fully_async = run(assets, tmp_path, *SPLIT, *on_policy, "trainer.total_training_steps=3")

    assert comparable(fully_async) == comparable(colocated)
    assert all(step["async/staleness_max"] == 0 for step in fully_async)


@pytest.mark.slow
def test_one_step_off_policy_trains_batch_k_plus_1_with_the_weights_of_step_k_minus_1(
    ray_started_here, assets, tmp_path
):
    steps = run(assets, tmp_path, *SPLIT, "async_training.mode=one_step_off", "trainer.total_training_steps=4")

    # step k trains with the weights of step k-1; batch k was sampled by those of step max(k-2, 0)
    assert [step["async/staleness_max"] for step in steps] == [0.0, 1.0, 1.0, 1.0]
    assert [step["async/samples_staleness_1"] for step in steps[1:]] == [1.0, 1.0, 1.0]
    assert "timing_s/wait_rollout" in steps[-1] and "async/rollout_idle_frac" in steps[-1]


@pytest.mark.slow
def test_the_staleness_bound_holds_under_a_deliberately_slow_trainer(ray_started_here, assets, tmp_path):
    overrides = ["async_training.mode=fully_async", "async_training.max_staleness=1", "async_training.chunk_prompts=1"]
    overrides.append("trainer.total_training_steps=4")
    steps = run(assets, tmp_path, *SPLIT, *overrides, slow_train_s=1.0)

    assert all(step["async/staleness_max"] <= 1 for step in steps)
    assert max(step["async/staleness_max"] for step in steps) == 1  # the rollout did run ahead of the trainer
    assert sum(step["async/admit_wait_s"] for step in steps) > 0  # ...and was held back at the bound
    assert steps[-1]["async/dropped_stale_groups"] == 0  # groups that could only be too stale never started
    assert {"async/buffer_groups", "async/tokens_staleness_1", "async/trainer_idle_frac"} <= set(steps[-1])


@pytest.mark.slow
def test_a_resumed_fully_async_run_continues_from_the_loader_position_of_its_last_trained_batch(
    ray_started_here, assets, tmp_path
):
    overrides = [*SPLIT, "async_training.mode=fully_async", "async_training.max_staleness=2", "trainer.save_freq=2"]
    overrides.append("async_training.chunk_prompts=1")  # a prompt group a request: the producer runs ahead by groups
    run(assets, tmp_path, *overrides, "trainer.total_training_steps=2")
    state = torch.load(tmp_path / "ckpt" / "global_step_2" / TRAINER_STATE_FILE, weights_only=True)

    # two batches of 4 prompts trained; what the producer had drawn ahead (up to 2 more batches) is regenerated
    assert state["dataloader_state"]["samples_seen"] == 8 and state["dataloader_state"]["epoch"] == 0
    resumed = run(assets, tmp_path, *overrides, "trainer.total_training_steps=3")
    assert [step["training/global_step"] for step in resumed[-1:]] == [3.0]
    assert resumed[-1]["async/staleness_max"] <= 2


@pytest.mark.slow
def test_a_rollout_pool_sharing_the_training_devices_reproduces_the_colocated_run_exactly(colocated, assets, tmp_path):
    shared = run(assets, tmp_path, *SPLIT, "trainer.rollout_shares_devices=True", "trainer.total_training_steps=3")

    assert comparable(shared) == comparable(colocated)
    assert all(step["rollout/weight_transfer_gb"] > 0 for step in shared)  # still its own process: weights cross
