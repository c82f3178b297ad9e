"""Loading configs: verl's command lines, the Python paths, verl spellings and no-op keys."""

import dataclasses
import logging

import pytest
from omegaconf import OmegaConf

from hyflow.config import (
    ActorConfig,
    ConfigError,
    DataConfig,
    PPOTrainerConfig,
    RolloutConfig,
    check_config,
    load_config,
)
from hyflow.config.convert import default_dict


def test_verl_gsm8k_ppo_quickstart_loads_into_a_typed_config(gsm8k_ppo_quickstart):
    config = load_config(gsm8k_ppo_quickstart, check_files=False)

    assert isinstance(config, PPOTrainerConfig)
    assert isinstance(config.data, DataConfig)
    assert isinstance(config.actor_rollout_ref.actor, ActorConfig)
    assert config.data.train_batch_size == 256
    assert config.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)
    assert config.critic.optim.lr == pytest.approx(1e-5)
    assert config.trainer.logger == ["console"]  # verl's quickstart passes a bare string
    assert config.algorithm.adv_estimator == "gae" and config.use_critic
    assert config.trainer.val_before_train is False


def test_verl_grpo_example_loads_and_vllm_runs_on_hyflows_engine_with_a_notice(gsm8k_grpo_example, caplog):
    with caplog.at_level(logging.WARNING, logger="hyflow.config"):
        config = load_config(gsm8k_grpo_example, check_files=False)

    rollout = config.actor_rollout_ref.rollout
    assert rollout.name == "hyflow"
    assert sum("hyflow runs this on its own generation engine" in r.getMessage() for r in caplog.records) == 1
    assert rollout.n == 5 and rollout.tensor_model_parallel_size == 2
    assert config.trainer.logger == ["console", "wandb"]
    assert config.trainer.project_name == "verl_grpo_example_gsm8k"
    assert config.actor_rollout_ref.ref.fsdp_config.param_offload is True
    assert not config.use_critic and config.use_reference_policy


def test_inherited_keys_take_the_value_of_the_key_they_follow():
    config = load_config(
        ["data.max_prompt_length=64", "data.max_response_length=32", "actor_rollout_ref.model.path=/m"],
        check_files=False,
    )

    assert config.actor_rollout_ref.rollout.prompt_length == 64
    assert config.actor_rollout_ref.rollout.response_length == 32
    assert config.critic.model.path == "/m"
    assert config.critic.ppo_mini_batch_size == config.actor_rollout_ref.actor.ppo_mini_batch_size
    assert config.actor_rollout_ref.ref.strategy == "fsdp"


def test_an_explicit_value_wins_over_the_inherited_one():
    config = load_config(
        ["actor_rollout_ref.rollout.prompt_length=100", "critic.model.path=/critic"], check_files=False
    )

    assert config.actor_rollout_ref.rollout.prompt_length == 100
    assert config.critic.model.path == "/critic"


def test_micro_batch_sizes_left_unset_become_the_whole_per_device_mini_batch():
    config = load_config(
        [
            "data.train_batch_size=16",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.rollout.n=4",
            "algorithm.adv_estimator=grpo",
            "trainer.n_gpus_per_node=2",
        ]
    )

    actor_rollout_ref = config.actor_rollout_ref
    assert actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 16  # 8 prompts * 4 samples / 2 devices
    assert actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 16
    assert actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 16


def test_verls_deprecated_global_micro_batch_size_is_divided_over_the_devices():
    config = load_config(["actor_rollout_ref.actor.ppo_micro_batch_size=16", "trainer.n_gpus_per_node=4"])

    assert config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4


def test_plus_prefix_is_accepted_for_a_key_that_exists_and_for_free_form_mappings():
    config = load_config(
        [
            "+actor_rollout_ref.actor.clip_ratio_high=0.28",
            "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
        ]
    )

    assert config.actor_rollout_ref.actor.clip_ratio_high == pytest.approx(0.28)
    assert config.actor_rollout_ref.actor.clip_ratio_low == pytest.approx(0.2)
    assert config.actor_rollout_ref.model.override_config == {"attention_dropout": 0.0}


def test_verl_spellings_are_read_under_hyflows_names():
    config = load_config(["ray_init.num_cpus=4", "actor_rollout_ref.actor.optim.warmup_style=cosine"])

    assert config.trainer.ray_init.num_cpus == 4
    assert config.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    assert config.actor_rollout_ref.actor.optim.warmup_style == "cosine"


def test_a_no_op_verl_key_is_accepted_with_a_notice_that_says_it_changes_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="hyflow.config"):
        load_config(["actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"])

    assert any("changes nothing" in r.getMessage() for r in caplog.records)


def test_interpolations_in_overrides_are_resolved():
    overrides = ["data.max_response_length=77", "actor_rollout_ref.rollout.max_model_len=${data.max_response_length}"]
    config = load_config(overrides)

    assert config.actor_rollout_ref.rollout.max_model_len == 77


def test_a_composed_dictconfig_loads_like_the_override_list():
    composed = OmegaConf.create(default_dict())
    composed.data.train_batch_size = 64
    composed.actor_rollout_ref.actor.ppo_mini_batch_size = 32

    assert load_config(composed) == load_config(
        ["data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=32"]
    )


def test_check_config_checks_a_config_built_in_python():
    built = PPOTrainerConfig(
        actor_rollout_ref=dataclasses.replace(
            PPOTrainerConfig().actor_rollout_ref,
            rollout=RolloutConfig(n="four"),  # type: ignore[arg-type]
        )
    )

    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.n='four' has the wrong type"):
        check_config(built)


def test_check_config_returns_a_filled_copy_of_a_good_config():
    checked = check_config(PPOTrainerConfig())

    assert checked.actor_rollout_ref.rollout.prompt_length == checked.data.max_prompt_length
    assert checked.trainer.device in ("cuda", "cpu")


def test_all_problems_are_reported_together_in_one_error():
    with pytest.raises(ConfigError) as caught:
        load_config(["data.train_batch_size=-1", "trainer.nnodes=0", "actor_rollout_ref.rollout.top_p=1.5"])

    assert len(caught.value.problems) == 3
    assert str(caught.value).startswith("3 problems in the config:")
    assert isinstance(caught.value, ValueError)


def test_validating_a_loaded_config_again_changes_nothing(gsm8k_grpo_example):
    loaded = load_config([*gsm8k_grpo_example, "critic.ppo_micro_batch_size=16"], check_files=False)

    assert check_config(loaded, check_files=False) == loaded
    assert loaded.critic.ppo_micro_batch_size is None and loaded.critic.ppo_micro_batch_size_per_gpu == 2


def test_the_actors_rollout_n_follows_rollout_n_unless_set_as_in_verl():
    from hyflow.config.actor_rollout_ref import ActorConfig

    config = load_config(["actor_rollout_ref.rollout.n=4", "algorithm.adv_estimator=grpo"], check_files=False)
    assert config.actor_rollout_ref.actor.rollout_n == 4
    assert ActorConfig(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=1).rollout_n == 2
