"""When the PPO trainer saves a checkpoint (`ppo_checkpoint.is_save_step`): every `trainer.save_freq` steps and
at the last step, never with save_freq=-1 (as in verl)."""

from __future__ import annotations

from hyflow.config.trainer import TrainerConfig
from hyflow.trainer.ppo_checkpoint import is_save_step


def test_a_checkpoint_is_saved_every_save_freq_steps_and_at_the_last_step():
    trainer = TrainerConfig(save_freq=3)
    assert [step for step in range(1, 8) if is_save_step(trainer, step, total_steps=7)] == [3, 6, 7]


def test_save_freq_minus_one_saves_no_checkpoint_not_even_at_the_last_step():
    trainer = TrainerConfig(save_freq=-1)
    assert not any(is_save_step(trainer, step, total_steps=4) for step in range(1, 5))
