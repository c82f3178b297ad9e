"""Split placement with several workers in each pool (Ray, CPU): 2 training workers (FSDP2 over gloo) and 2
rollout workers, as `benchmarks/async_rl.py --gpus 4` runs them.

After a run, and after one more sync of the trainer's latest version, every rollout worker's engine holds exactly
the weights the training ranks hold (gathered from their FSDP2 shards, loaded into a fresh engine model here), under
that version; and each rollout worker generated its share of every batch (the prompts go to both engines, not all to
the first). A sync that reached only the first rollout worker, a training rank > 0 that sent nothing into rank 0's
gather, or a rollout pool of one engine would fail them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from hyflow.trainer.placement import ACTOR_ROLLOUT, ROLLOUT
from hyflow.trainer.ppo_trainer import PPOTrainer
from tests.trainer.ppo_testkit import build_assets_with_reward, read_metrics, tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

STEPS = 2
TWO_BY_TWO = [
    "trainer.backend=ray",
    "trainer.ray_init.num_cpus=2",
    "trainer.placement=split",
    "trainer.n_gpus_per_node=2",
    "trainer.rollout_n_gpus_per_node=2",
    f"trainer.total_training_steps={STEPS}",
]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_assets_with_reward(tmp_path_factory.mktemp("pool_assets"))


def count_generated_rows(worker) -> None:
    """On a rollout worker: count the rows each `generate_sequences` call brings (`worker.rows_generated`)."""
    role = worker.roles[ROLLOUT]
    generate = role.generate_sequences
    role.rows_generated = 0

    def counting(prompts):
        role.rows_generated += len(prompts)
        return generate(prompts)

    role.generate_sequences = counting


def rows_generated(worker) -> int:
    return worker.roles[ROLLOUT].rows_generated


def engine_state(worker) -> tuple[int, dict[str, torch.Tensor]]:
    """On a rollout worker: (policy version, the engine model's tensors)."""
    engine = worker.roles[ROLLOUT].rollout.engine
    return engine.policy_version, {name: t.detach().clone() for name, t in engine.model.state_dict().items()}


def full_actor_weights(worker) -> dict[str, torch.Tensor]:
    """On every training worker at once (the gather is a collective): the actor's full HF-named tensors."""
    return {name: tensor.clone() for name, tensor in worker.roles[ACTOR_ROLLOUT].actor_weights()}


def on_each(group, function) -> list:
    """`function(worker object)` in every worker process of a Ray group, concurrently; the results by rank."""
    import ray

    return ray.get([handle.__ray_call__.remote(function) for handle in group.workers])


def run_two_by_two(assets: dict, out: Path, *overrides: str) -> tuple[list[dict], list, list[int], dict]:
    """Train STEPS steps on 2 + 2 workers, then sync the latest version once more; returns (metrics per step, each
    rollout worker's (version, engine tensors), the rows each generated, the trainer's full weights)."""
    config = tiny_config(assets, out, f"custom_reward_function.path={assets['reward']}", *TWO_BY_TWO, *overrides)
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(out):
        trainer = PPOTrainer(config)
        trainer.init_workers()
        try:
            rollout_pool, training_pool = trainer.workers.rollout, trainer.workers.actor_rollout
            on_each(rollout_pool, count_generated_rows)
            trainer.fit()
            trainer.split.weights.sync(trainer.global_step)  # one_step_off holds step k−1's weights after step k
            engines = on_each(rollout_pool, engine_state)
            rows = on_each(rollout_pool, rows_generated)
            trainer_weights = on_each(training_pool, full_actor_weights)[0]
        finally:
            trainer.close()
        return [step["data"] for step in read_metrics(trainer.tracking.log_dir)], engines, rows, trainer_weights


def engine_tensors_of(model_path: str, weights: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors of a fresh engine model in `dtype` (the rollout's) after loading `weights` into it."""
    from hyflow.engine.models import load_model

    model = load_model(model_path, dtype=dtype)
    model.load_weights(weights.items())
    return model.state_dict()


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(["async_training.mode=sync"], id="sync"),
        pytest.param(["async_training.mode=one_step_off"], id="one_step_off", marks=pytest.mark.slow),
        pytest.param(
            ["async_training.mode=fully_async", "async_training.max_staleness=1", "async_training.chunk_prompts=2"],
            id="fully_async",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_every_rollout_worker_holds_the_trainers_weights_after_a_sync_and_generates_its_share(
    ray_started_here, assets, tmp_path, mode
):
    steps, engines, rows, trainer_weights = run_two_by_two(assets, tmp_path, *mode)

    assert [step["training/global_step"] for step in steps] == [1.0, 2.0]
    dtype = next(iter(engines[0][1].values())).dtype  # the engine's (rollout.dtype), whatever the actor's
    expected = engine_tensors_of(assets["model"], trainer_weights, dtype)
    initial = engine_tensors_of(assets["model"], {}, dtype)
    assert len(engines) == 2
    for version, tensors in engines:
        assert version == STEPS
        assert tensors.keys() == expected.keys()
        assert all(torch.equal(tensors[name], expected[name]) for name in expected)
    assert any(not torch.equal(initial[name], expected[name]) for name in expected)  # the updates moved weights
    # 4 prompts x 2 samples a step, split evenly over the two engines (fully async may run a chunk ahead)
    assert rows[0] == rows[1] and rows[0] >= STEPS * 4 * 2 // 2
