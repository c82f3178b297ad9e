"""The PPO trainer's checkpoint of one step: what a save writes and what a resume puts back.

    save_ppo_checkpoint(checkpoints, workers, step, kl_ctrl, train_loader, split)     # trainer.save_freq
    step = resume_ppo_checkpoint(checkpoints, config.trainer, workers, kl_ctrl, train_loader)  # None: fresh
    if is_save_step(config.trainer, step, total_steps): ...                          # after a step's metrics line

A save: the actor (and critic) workers write their shards into `global_step_N/{actor,critic}`, then
`StepCheckpoints.finalize` writes the trainer state (dataloader position, RNG states, the adaptive KL
coefficient) that marks the step complete. In the asynchronous modes the dataloader position comes from the
rollout pool (`SplitRollout.loader_state`), which has read ahead of the trainer. A resume loads the same pieces
in the same order and returns the step to continue after. The folder layout, checksums and the choice of which
step to resume live in `checkpoint_manager.py`.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from hyflow.algorithms.kl import AdaptiveKLController, FixedKLController
from hyflow.config.trainer import TrainerConfig
from hyflow.data.sampler import StatefulDataLoader
from hyflow.trainer.checkpoint_manager import ACTOR_DIR, CRITIC_DIR, StepCheckpoints, restore_rng_state
from hyflow.trainer.checkpoint_save import failed_save_reported

if TYPE_CHECKING:
    from hyflow.trainer.async_rollout import SplitRollout
    from hyflow.trainer.placement import WorkerGroups

KLController = FixedKLController | AdaptiveKLController

__all__ = ["is_save_step", "no_checkpoint_message", "resume_ppo_checkpoint", "save_ppo_checkpoint"]

KL_COEF = "kl_coef"  # the trainer state's extra key for the adaptive KL controller's value


def is_save_step(trainer: TrainerConfig, step: int, total_steps: int) -> bool:
    """A checkpoint every `trainer.save_freq` steps and at the last step; none with save_freq=-1 (as in verl)."""
    return trainer.save_freq > 0 and (step % trainer.save_freq == 0 or step >= total_steps)


def no_checkpoint_message(trainer: TrainerConfig, num_steps: int) -> str:
    """What a run that trained `num_steps` steps and saved no checkpoint says when it ends."""
    return (
        f"this run trained {num_steps} step(s) and saved no checkpoint (trainer.save_freq={trainer.save_freq}; -1, "
        "the default as in verl, saves none in `hyflow train`), so there is nothing to resume or to turn into a "
        "Hugging Face folder with `hyflow merge`. Fix: set trainer.save_freq=N to save every N steps and after the "
        "last one."
    )


def save_ppo_checkpoint(
    checkpoints: StepCheckpoints,
    workers: WorkerGroups,
    step: int,
    kl_ctrl: KLController,
    train_loader: StatefulDataLoader,
    split: SplitRollout | None = None,
) -> None:
    """Write step `step`: the workers' shards first, then the trainer state that marks the folder complete. A failed
    write (a full disk) removes the step's unfinished files and raises `CheckpointSaveError` naming the folder, the
    free space and the fix (`checkpoint_save`); the previous checkpoints are kept."""
    with failed_save_reported(checkpoints.root, step, keep_key="trainer.max_actor_ckpt_to_keep"):
        path = checkpoints.step_dir(step)
        workers.actor_rollout.save_checkpoint(str(path / ACTOR_DIR), global_step=step)
        if workers.critic is not None:
            workers.critic.save_checkpoint(str(path / CRITIC_DIR), global_step=step)
        extra = {KL_COEF: float(kl_ctrl.value)}
        loader_state = split.loader_state(step) if split is not None else None
        checkpoints.finalize(step, loader_state or train_loader.state_dict(), extra=extra)


def resume_ppo_checkpoint(
    checkpoints: StepCheckpoints,
    trainer: TrainerConfig,
    workers: WorkerGroups,
    kl_ctrl: KLController,
    train_loader: StatefulDataLoader,
) -> int | None:
    """Load the checkpoint `trainer.resume_mode` picks into the workers, the loader, the RNGs and `kl_ctrl`;
    returns its step, or None when there is none to resume (the run starts from scratch)."""
    state = checkpoints.resume(trainer.resume_mode, trainer.resume_from_path)
    if state is None:
        return None
    workers.actor_rollout.load_checkpoint(str(state.path / ACTOR_DIR))
    if workers.critic is not None:
        workers.critic.load_checkpoint(str(state.path / CRITIC_DIR))
    if state.dataloader_state is not None:
        train_loader.load_state_dict(state.dataloader_state)
    if state.rng_state is not None:
        restore_rng_state(state.rng_state)
    kl_ctrl.value = state.extra.get(KL_COEF, kl_ctrl.value)
    if trainer.del_local_ckpt_after_load:
        shutil.rmtree(state.path)
    return state.global_step
