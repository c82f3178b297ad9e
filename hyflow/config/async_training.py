"""`async_training.*` (verl's section name for its asynchronous recipes): how generation and training overlap.

    trainer.placement=split async_training.mode=one_step_off            # batch k+1 generated while step k trains
    trainer.placement=split async_training.mode=fully_async async_training.max_staleness=2

`mode=sync` (the default) generates each batch with the latest weights and then trains on it, colocated or split.
The asynchronous modes need `trainer.placement=split` (a rollout pool beside the training pool, Ray backend), so
that generating and updating can run at the same time; the trainer is the same (`PPOTrainer.fit`), only where its
generated batches come from changes (`hyflow.trainer.async_rollout`). The how-to is docs/howto/async_rl.md.
Load-time rules live in `check_async_training`, one message per broken rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from hyflow.config.ppo_trainer import PPOTrainerConfig

__all__ = ["CHUNK_ROWS", "AsyncTrainingConfig", "check_async_training", "chunk_prompts_of"]

AsyncMode = Literal["sync", "one_step_off", "fully_async"]

# Rows each rollout engine gets per chunk when `chunk_prompts` is 0 (auto). Below a few hundred rows a decode step
# is bound by the host, not the GPU: on one H200 (0.5B shape, 64 prompts x 8 samples of 256 tokens per step),
# fully_async at staleness 1 ran at 0.56x the synchronous split run with chunks of 8 prompts (64 rows) and at 1.01x
# with chunks of 32 (256 rows) (benchmarks/README.md, "Asynchronous training").
CHUNK_ROWS = 256


@dataclass
class AsyncTrainingConfig:
    """Which batches the trainer trains on: fresh ones (sync), one step old, or any within a staleness bound."""

    # sync: generate, then train, every step; one_step_off: batch k+1 is generated with the weights of step k-1
    # while step k trains; fully_async: the rollout pool generates continuously into a buffer (split placement)
    mode: AsyncMode = "sync"
    # fully_async: the most policy versions (optimizer steps) a trained sample may lag behind the weights it
    # updates; older samples are dropped, and no generation starts that could only finish older (0: on-policy)
    max_staleness: int = 1
    # fully_async: prompts per generation request (each with its rollout.n samples): the unit the buffer schedules;
    # 0 (auto): the fewest prompts dividing data.train_batch_size that give every rollout engine 256 rows (CHUNK_ROWS)
    # (the whole batch if none does); agent loops schedule each prompt group alone (1)
    chunk_prompts: int = 0


def chunk_prompts_of(config: PPOTrainerConfig) -> int:
    """Prompts per fully-async generation request: `async_training.chunk_prompts`, or for 0 (auto) the smallest
    divisor d of B = data.train_batch_size with d · n ≥ CHUNK_ROWS · E (n = rollout.n samples a prompt, E = rollout
    engines: the rollout pool's workers, or the training pool's in the colocated placement), else B; 1 with agent
    loops, which schedule every prompt group on its own."""
    settings, trainer = config.async_training, config.trainer
    rollout = config.actor_rollout_ref.rollout
    if settings.chunk_prompts:
        return settings.chunk_prompts
    if rollout.multi_turn.enable:
        return 1
    if trainer.placement == "split":
        engines = trainer.rollout_nnodes * trainer.rollout_n_gpus_per_node
    else:
        engines = trainer.nnodes * trainer.n_gpus_per_node
    engines //= max(rollout.tensor_model_parallel_size, 1)
    batch = config.data.train_batch_size
    wanted = CHUNK_ROWS * max(engines, 1)
    return next((d for d in range(1, batch + 1) if batch % d == 0 and d * rollout.n >= wanted), batch)


def check_async_training(config: PPOTrainerConfig) -> list[str]:
    """The problems of `trainer.placement` and `async_training` in `config` (empty when it can run)."""
    trainer, settings = config.trainer, config.async_training
    rollout = config.actor_rollout_ref.rollout
    problems: list[str] = []
    if settings.mode != "sync" and trainer.placement != "split":
        problems.append(
            f"async_training.mode={settings.mode!r} overlaps generation with training, which needs a rollout pool "
            f"of its own, but trainer.placement={trainer.placement!r}. Fix: set trainer.placement=split (and "
            "trainer.rollout_n_gpus_per_node), or async_training.mode=sync."
        )
    if trainer.placement == "split":
        if trainer.backend == "local":
            problems.append(
                "trainer.placement='split' runs rollout and training in separate worker processes, which "
                "trainer.backend='local' (one process) cannot. Fix: set trainer.backend=ray (or auto)."
            )
        training, rollout_pool = (
            trainer.nnodes * trainer.n_gpus_per_node,
            trainer.rollout_nnodes * trainer.rollout_n_gpus_per_node,
        )
        if trainer.rollout_shares_devices and rollout_pool != training:
            problems.append(
                f"trainer.rollout_shares_devices=True places one rollout process beside each of the {training} "
                f"training processes, but the rollout pool is trainer.rollout_nnodes × rollout_n_gpus_per_node = "
                f"{rollout_pool}. Fix: set them to trainer.nnodes={trainer.nnodes} and "
                f"trainer.n_gpus_per_node={trainer.n_gpus_per_node}."
            )
        if rollout.tensor_model_parallel_size != 1:
            problems.append(
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={rollout.tensor_model_parallel_size} with "
                "trainer.placement='split': the rollout pool runs one engine per worker. Fix: set it to 1."
            )
        if config.actor_rollout_ref.model.lora_rank > 0:
            problems.append(
                f"actor_rollout_ref.model.lora_rank={config.actor_rollout_ref.model.lora_rank} with "
                "trainer.placement='split' is not supported yet (the rollout pool would need the base weights and "
                "the adapter). Fix: set trainer.placement=colocated, or lora_rank=0."
            )
    if settings.mode == "sync":
        return problems
    if config.algorithm.adv_estimator == "remax":
        problems.append(
            f"async_training.mode={settings.mode!r} with algorithm.adv_estimator='remax': ReMax's greedy baseline "
            "is a second, synchronous generation per batch. Fix: use async_training.mode=sync, or another estimator."
        )
    if config.algorithm.filter_groups.enable:
        problems.append(
            f"async_training.mode={settings.mode!r} with algorithm.filter_groups.enable=True is not supported yet "
            "(dynamic sampling draws a variable number of generation batches per step). "
            "Fix: use async_training.mode=sync."
        )
    if rollout.multi_turn.enable:
        problems += _agent_loop_problems(config)
    if (
        settings.mode == "fully_async"
        and settings.chunk_prompts
        and config.data.train_batch_size % settings.chunk_prompts
    ):
        problems.append(
            f"async_training.chunk_prompts={settings.chunk_prompts} must divide data.train_batch_size="
            f"{config.data.train_batch_size} (a training batch is whole chunks). Fix: pick a divisor, or 0 (auto)."
        )
    return problems


def _agent_loop_problems(config: PPOTrainerConfig) -> list[str]:
    """Agent loops (multi-turn) in an asynchronous mode: they run on the manager's background event loop, in
    fully_async each prompt group a task of its own (hyflow.trainer.agent_groups), and weights may reach the engines
    while their turns run."""
    settings, rollout = config.async_training, config.actor_rollout_ref.rollout
    problems = []
    if settings.mode == "fully_async" and settings.chunk_prompts > 1:
        problems.append(
            f"async_training.chunk_prompts={settings.chunk_prompts} with multi-turn agent loops: every prompt group "
            "is scheduled on its own, so chunks do not apply. Fix: leave async_training.chunk_prompts at 0 (auto) "
            "or 1."
        )
    if rollout.name != "hyflow":
        problems.append(
            f"actor_rollout_ref.rollout.name={rollout.name!r} with agent loops in async_training.mode="
            f"{settings.mode!r}: new weights are loaded while turns run, which needs hyflow's engine (it pauses "
            "them at a step boundary). Fix: set actor_rollout_ref.rollout.name=hyflow."
        )
    return problems
