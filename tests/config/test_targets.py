"""omega_conf_to_dataclass: config dataclasses built from mappings that name their class with `_target_`."""

import pytest
from omegaconf import OmegaConf

from hyflow.config import OptimConfig
from hyflow.config.targets import omega_conf_to_dataclass
from hyflow.config.verl_engine import FSDPOptimizerConfig
from hyflow.config.verl_workers import FSDPActorConfig

_ACTOR = "hyflow.config.verl_workers.FSDPActorConfig"


def test_nested_sections_take_their_target_or_their_fields_type():
    config = omega_conf_to_dataclass(
        OmegaConf.create(
            {
                "_target_": _ACTOR,
                "ppo_micro_batch_size_per_gpu": 4,
                "rollout_n": 2,
                "optim": {"lr": 0.5},  # no target: the field's type
                "fsdp_config": {"_target_": "hyflow.config.verl_engine.FSDPEngineConfig", "param_offload": True},
            }
        )
    )
    assert isinstance(config, FSDPActorConfig) and isinstance(config.optim, FSDPOptimizerConfig)
    assert config.optim.lr == 0.5 and config.fsdp_config.param_offload is True


def test_the_class_can_be_given_instead_of_a_target():
    assert omega_conf_to_dataclass({"lr": 0.1}, OptimConfig) == OptimConfig(lr=0.1)
    assert omega_conf_to_dataclass(None) is None


def test_an_unknown_key_gets_the_closest_field():
    with pytest.raises(ValueError, match=r"optim.lrr is not a field of FSDPOptimizerConfig. Did you mean 'lr'\?"):
        omega_conf_to_dataclass({"_target_": _ACTOR, "ppo_micro_batch_size_per_gpu": 1, "optim": {"lrr": 1}})


@pytest.mark.parametrize(
    ("target", "message"),
    [("os.system", "not a config dataclass"), ("hyflow.config.nothing_here.X", "names no importable class")],
)
def test_only_config_dataclasses_are_built(target, message):
    with pytest.raises(ValueError, match=message):
        omega_conf_to_dataclass({"_target_": target})
