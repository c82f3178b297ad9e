"""verl's Ulysses sequence parallelism, read as plain data parallelism (hyflow has no sequence parallelism).

`fold_sequence_parallel(config)` runs once at load (`validation.finalize`), before inherited keys are filled, so a
key that inherits a folded one (`rollout.log_prob_max_token_len_per_gpu` from the actor's budget) gets the folded
value.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def fold_sequence_parallel(config: Any) -> None:
    """Read verl's Ulysses sequence parallelism as plain data parallelism, in place (a `PPOTrainerConfig`).

    verl with sequence-parallel size sp splits each sequence over sp devices, so its data-parallel size is
    `world / sp`, a micro-batch of `m` samples per "GPU" spans sp devices, and the token budget of a device is
    multiplied by sp (`ppo_max_token_len_per_gpu * sp` per sequence-parallel group). hyflow has no sequence
    parallelism: every device holds whole sequences. The same losses come out (they are normalised over the
    global mini-batch) with the per-device numbers `m // sp` (at least 1) and `budget * sp`, at the price of more
    activation memory per device. Each folded section gets one notice and sp = 1.
    """
    arr, critic = config.actor_rollout_ref, config.critic
    actor_sp = arr.actor.ulysses_sequence_parallel_size
    ref_sp = max(actor_sp, arr.ref.ulysses_sequence_parallel_size)  # the worker's device mesh is the actor's
    _fold(
        arr.actor, actor_sp, "actor_rollout_ref.actor", ["ppo_micro_batch_size_per_gpu"], ["ppo_max_token_len_per_gpu"]
    )
    _fold(
        arr.rollout,
        actor_sp,
        "actor_rollout_ref.rollout",
        ["log_prob_micro_batch_size_per_gpu"],
        ["log_prob_max_token_len_per_gpu"],
    )
    _fold(
        arr.ref,
        ref_sp,
        "actor_rollout_ref.ref",
        ["log_prob_micro_batch_size_per_gpu"],
        ["log_prob_max_token_len_per_gpu"],
    )
    _fold(
        critic,
        critic.ulysses_sequence_parallel_size,
        "critic",
        ["ppo_micro_batch_size_per_gpu", "forward_micro_batch_size_per_gpu"],
        ["ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu"],
    )
    reward_model = config.reward_model
    _fold(
        reward_model,
        reward_model.ulysses_sequence_parallel_size,
        "reward_model",
        ["micro_batch_size_per_gpu"],
        ["forward_max_token_len_per_gpu"],
    )


def _fold(section: Any, sp: int, prefix: str, micro_batch_keys: list[str], token_keys: list[str]) -> None:
    if sp <= 1:
        return
    changes = []
    for name in micro_batch_keys:
        value = getattr(section, name)
        if value is not None:
            setattr(section, name, max(1, value // sp))
            changes.append(f"{prefix}.{name}={value} -> {getattr(section, name)}")
    for name in token_keys:
        value = getattr(section, name)
        if value is not None:
            setattr(section, name, value * sp)
            changes.append(f"{prefix}.{name}={value} -> {value * sp}")
    if hasattr(section, "ulysses_sequence_parallel_size"):
        section.ulysses_sequence_parallel_size = 1
    logger.warning(
        "config: Ulysses sequence parallelism (size %d) for %s: hyflow has none, so every device holds whole "
        "sequences (more activation memory per device, the same losses); per-device sizes: %s.",
        sp,
        prefix,
        ", ".join(changes) or "unchanged",
    )
