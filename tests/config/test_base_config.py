"""BaseConfig: a config dataclass read like a dict, as verl's configs are."""

import dataclasses
from dataclasses import dataclass

import pytest

from hyflow.config.base_config import BaseConfig


@dataclass
class LossConfig(BaseConfig):
    beta: float = 0.1
    mode: str = "dro"


def test_fields_read_by_key_by_get_and_as_a_dict():
    config = LossConfig()
    assert config["beta"] == 0.1 and config.get("gamma", 1.0) == 1.0
    assert dict(config) == {"beta": 0.1, "mode": "dro"} and len(config) == 2


def test_attributes_set_later_are_keys_too_and_fields_stay_assignable():
    config = LossConfig()
    config.beta = 0.2
    config.extra = "x"
    assert config["beta"] == 0.2 and config["extra"] == "x" and "extra" in config


def test_a_missing_key_names_the_keys_there_are():
    with pytest.raises(AttributeError, match=r"no key 'gamma'; its keys are \['beta', 'mode'\]"):
        LossConfig()["gamma"]


def test_a_key_that_is_not_a_string_is_a_type_error():
    with pytest.raises(TypeError, match="strings"):
        LossConfig()[0]


@dataclass
class FrozenLossConfig(BaseConfig):
    _mutable_fields = frozenset({"beta"})

    beta: float = 0.1
    mode: str = "dro"

    def __post_init__(self) -> None:
        self.mode = self.mode.lower()  # before _freeze: still assignable
        self._freeze()


def test_a_class_naming_its_mutable_fields_freezes_the_others_once_built():
    config = FrozenLossConfig(mode="DRO")
    config.beta = 0.3
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"FrozenLossConfig.mode is frozen.*\['beta'\]"):
        config.mode = "gspo"
    assert config.mode == "dro" and config.beta == 0.3
