"""Agent loops in the fully asynchronous mode on the Ray backend, CPU: one training and one rollout worker, each
prompt group scheduled on its own (hyflow.trainer.agent_groups).

The loop here makes two turns around a tool call. The first sample to reach its tool call meets a deliberately
slow tool: it answers only once the weights of step 2 have reached the rollout pool. With 12 prompts and batches of
4, steps 1 and 2 are trained on the other groups while that sample waits (a batch-level scheduler would wait for it
and never train step 1); its second turn is sampled by the new weights, and each token records its version.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import threading
from pathlib import Path

import pytest
import torch

from hyflow import fields as F
from hyflow.trainer.ppo_trainer import PPOTrainer
from tests.trainer.ppo_testkit import build_assets_with_reward, read_metrics, tiny_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from async_rl import register_tool_turn_loop  # benchmarks/async_rl.py: the loop its agent mode measures

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

RELEASE_AFTER_STEP = 2
FULLY_ASYNC = ["async_training.mode=fully_async"]


class SlowTool:
    """The first call blocks until `release` is set (at most `timeout_s`); the others answer at once."""

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.release = threading.Event()
        self.calls = itertools.count()
        self.timeout_s = timeout_s

    async def __call__(self) -> str:
        if next(self.calls) == 0 and not await asyncio.to_thread(self.release.wait, self.timeout_s):
            raise RuntimeError(f"the slow tool was not released within {self.timeout_s} s")
        return " ok"


SLOW_TOOL = SlowTool()


register_tool_turn_loop("slow_tool_test_agent", lambda: SLOW_TOOL())  # turn, a call of SLOW_TOOL, turn


def run(out: Path, *overrides: str, slow_tool: bool = True) -> tuple[list[dict], list[dict], PPOTrainer]:
    """Train on 12 prompts (3 batches); returns each step's metrics, what each step trained, and the trainer.
    Without `slow_tool` every tool call answers at once."""
    assets = build_assets_with_reward(out / "assets")
    config = tiny_config(
        assets,
        out,
        f"custom_reward_function.path={assets['reward']}",
        "trainer.backend=ray",
        "trainer.ray_init.num_cpus=2",
        "trainer.placement=split",
        "trainer.total_training_steps=3",
        "trainer.total_epochs=1",
        "data.train_max_samples=12",
        "data.return_raw_chat=True",
        "data.max_response_length=16",
        "actor_rollout_ref.rollout.ignore_eos=True",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.agent.default_agent_loop=slow_tool_test_agent",
        *overrides,
    )
    global SLOW_TOOL
    SLOW_TOOL = SlowTool()
    if not slow_tool:
        SLOW_TOOL.release.set()
    trained: list[dict] = []
    with contextlib.chdir(out):
        trainer = PPOTrainer(config)
        trainer.init_workers()
        train_step, after_update = trainer.train_step, trainer.split.after_update

        def recording_train_step(batch, timing):
            uids = list(batch.non_tensor_batch[F.UID])
            versions = [sorted(set(row.tolist()) - {-1}) for row in batch.batch[F.ROLLOUT_POLICY_VERSIONS]]
            trained.append({"uids": uids, "versions": versions, "tool_versions": tool_token_versions(batch)})
            return train_step(batch, timing)

        def releasing_after_update(version, timing):
            after_update(version, timing)  # the weights of `version` are in the rollout pool now
            if version == RELEASE_AFTER_STEP:
                SLOW_TOOL.release.set()

        trainer.train_step, trainer.split.after_update = recording_train_step, releasing_after_update
        try:
            trainer.fit()
        finally:
            trainer.close()
        return [step["data"] for step in read_metrics(trainer.tracking.log_dir)], trained, trainer


def tool_token_versions(batch) -> set[int]:
    """The versions recorded on response tokens outside the loss (tool answers, padding)."""
    versions, mask = batch.batch[F.ROLLOUT_POLICY_VERSIONS], batch.batch[F.RESPONSE_MASK]
    return set(versions[mask == 0].tolist())


def test_a_slow_tool_call_holds_back_only_its_own_group_and_its_later_turn_records_the_newer_version(
    ray_started_here, tmp_path
):
    steps, trained, _ = run(tmp_path, *FULLY_ASYNC, "async_training.max_staleness=2")

    assert [step["training/global_step"] for step in steps] == [1.0, 2.0, 3.0]
    # steps 1 and 2 trained 8 whole groups while the slow sample waited, sampled by versions 0 and 1
    for batch in trained:
        assert all(batch["uids"].count(uid) == 2 for uid in batch["uids"])  # rollout.n=2, groups stay whole
        assert batch["tool_versions"] == {-1}  # tool tokens and padding carry no version
    assert all(v and max(v) <= 1 for batch in trained[:2] for v in batch["versions"])
    # the slow sample is trained at step 3: turn 1 by version 0, turn 2 by the weights of step 2
    assert trained[2]["versions"].count([0, 2]) == 1
    assert steps[2]["async/staleness_max"] == 2  # within the bound, judged by its oldest token
    assert steps[2]["async/dropped_stale_groups"] == 0
    assert steps[0]["async/groups_in_flight"] >= 1  # the slow group, at least, was still generating


@pytest.mark.slow
def test_a_slow_sample_that_ends_beyond_the_staleness_bound_is_dropped_and_counted(ray_started_here, tmp_path):
    steps, trained, trainer = run(tmp_path, *FULLY_ASYNC, "async_training.max_staleness=1")

    # step 3 would need the slow group, which turn 1 (version 0) makes 2 versions old: dropped; 3 groups are
    # left, too few for a batch, so training ends after step 2
    assert [step["training/global_step"] for step in steps] == [1.0, 2.0]
    assert all(step["async/staleness_max"] <= 1 for step in steps)
    assert trainer.split.source.buffer.num_dropped_groups == 1
    assert all(version != [0, 2] for batch in trained for version in batch["versions"])
    assert torch.tensor([len(batch["uids"]) for batch in trained]).eq(8).all()


@pytest.mark.slow
def test_one_step_off_policy_runs_agent_loops_with_batch_k_plus_1_sampled_by_the_weights_of_step_k_minus_1(
    ray_started_here, tmp_path
):
    steps, trained, _ = run(tmp_path, "async_training.mode=one_step_off", slow_tool=False)

    assert [step["async/staleness_max"] for step in steps] == [0.0, 1.0, 1.0]
    assert [batch["versions"] for batch in trained] == [[[v]] * 8 for v in (0, 0, 1)]  # each sample one version
    assert all(step["agent/num_turns/mean"] == 4 for step in steps)  # prompt, turn, tool, turn
