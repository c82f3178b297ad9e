"""The rules of `async_training.*` that read other sections of the run's config: which settings can run together
(`check_async_training`, called when the config loads) and the prompts per fully-async generation request
(`chunk_prompts_of`). The section itself, `AsyncTrainingConfig`, is in `hyflow.config.async_training`; the
how-to is docs/howto/async_rl.md.
"""

from __future__ import annotations

from hyflow.config.async_training import CHUNK_ROWS
from hyflow.config.ppo_trainer import PPOTrainerConfig

__all__ = ["check_async_training", "chunk_prompts_of"]


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
