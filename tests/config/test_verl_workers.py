"""verl's worker config classes: hyflow's actor section with verl's checks at construction and `validate`."""

import dataclasses

import pytest

from hyflow.config import ActorConfig as HyflowActorConfig
from hyflow.config import ConfigError
from hyflow.config.verl_engine import FSDPEngineConfig, McoreEngineConfig
from hyflow.config.verl_workers import ActorConfig, FSDPActorConfig, McoreActorConfig


def test_the_verl_actor_is_hyflows_actor_section():
    config = FSDPActorConfig(ppo_micro_batch_size_per_gpu=2, clip_ratio=0.3)
    assert isinstance(config, HyflowActorConfig) and config.clip_ratio_high == 0.3
    assert isinstance(config.fsdp_config, FSDPEngineConfig) and config["strategy"] == "fsdp"


def test_the_micro_batch_size_is_given_exactly_once_unless_batches_are_cut_by_tokens():
    with pytest.raises(ConfigError, match=r"You have set both actor.ppo_micro_batch_size=4"):
        ActorConfig(ppo_micro_batch_size=4, ppo_micro_batch_size_per_gpu=2)
    with pytest.raises(ConfigError, match=r"Please set at least one of actor.ppo_micro_batch_size"):
        ActorConfig()
    assert ActorConfig(use_dynamic_bsz=True).ppo_micro_batch_size_per_gpu is None


def test_an_unknown_loss_aggregation_is_rejected_with_the_allowed_ones():
    with pytest.raises(ValueError, match=r"Invalid loss_agg_mode.*'token-mean'"):
        ActorConfig(loss_agg_mode="mean", use_dynamic_bsz=True)


def test_batch_sizes_stay_assignable_and_the_rest_is_frozen():
    config = ActorConfig(ppo_micro_batch_size_per_gpu=2)
    config.ppo_mini_batch_size = 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.clip_ratio = 0.5


def test_validate_applies_hyflows_batch_size_rules_to_the_section():
    config = ActorConfig(ppo_mini_batch_size=256, ppo_micro_batch_size=8, rollout_n=1)
    with pytest.raises(ConfigError, match=r"larger than data.train_batch_size=128"):
        config.validate(n_gpus=8, train_batch_size=128)
    with pytest.raises(ConfigError, match="must be >= n_gpus"):
        config.validate(n_gpus=16, train_batch_size=512)
    config.validate(n_gpus=8, train_batch_size=512)


def test_verls_sequence_parallelism_needs_padding_free_batches():
    config = FSDPActorConfig(ulysses_sequence_parallel_size=2, use_dynamic_bsz=True)
    with pytest.raises(ValueError, match="you must enable `use_remove_padding`"):
        config.validate(n_gpus=8, train_batch_size=256, model_config={"use_remove_padding": False})
    config.validate(n_gpus=8, train_batch_size=256, model_config={"use_remove_padding": True})


def test_the_megatron_actor_holds_megatron_sections():
    config = McoreActorConfig(ppo_micro_batch_size_per_gpu=1)
    assert config.strategy == "megatron" and isinstance(config.megatron, McoreEngineConfig)
    with pytest.raises(ValueError, match="Invalid strategy"):
        FSDPActorConfig(strategy="megatron", use_dynamic_bsz=True)
