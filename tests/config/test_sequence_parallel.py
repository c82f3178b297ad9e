"""verl's Ulysses sequence parallelism loads as data parallelism with verl's per-device numbers."""

import logging

from hyflow.config import load_config


def test_ulysses_sequence_parallelism_is_read_as_data_parallelism_with_verls_per_device_numbers(caplog):
    overrides = [
        "data.train_batch_size=32",
        "data.max_prompt_length=1024",
        "data.max_response_length=3072",
        "trainer.n_gpus_per_node=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024",  # verl: 1024 * sp = 4096 per sequence group
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4",  # verl >= 0.8 spelling
        "critic.ulysses_sequence_parallel_size=2",
        "critic.ppo_micro_batch_size_per_gpu=4",  # verl: 4 samples per group of 2 devices
    ]
    with caplog.at_level(logging.WARNING, logger="hyflow.config"):
        config = load_config(overrides)

    actor, critic = config.actor_rollout_ref.actor, config.critic
    assert actor.ppo_max_token_len_per_gpu == 4096 and actor.ulysses_sequence_parallel_size == 1
    assert config.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 4096  # inherits the folded budget
    assert critic.ppo_micro_batch_size_per_gpu == 2 and critic.ulysses_sequence_parallel_size == 1
    folded = [r.getMessage() for r in caplog.records if "Ulysses sequence parallelism (size 4)" in r.getMessage()]
    assert len(folded) == 3  # the actor, the rollout's log-prob pass and the ref share the actor's device mesh
