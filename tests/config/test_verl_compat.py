"""verl keys hyflow does not implement are rejected by name; renamed ones are translated."""

import logging

import pytest

from hyflow.config import ConfigError, PPOTrainerConfig, load_config
from hyflow.config.verl_compat import ignored_reason, renamed_key, unsupported_reason


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    return caught.value.problems


def test_a_verl_feature_hyflow_lacks_is_rejected_by_name():
    (problem,) = _problems(["+actor_rollout_ref.model.use_liger=True"])

    assert problem.startswith("'actor_rollout_ref.model.use_liger' is a verl key for Liger kernels")
    assert "hyflow does not implement" in problem and "Fix: remove" in problem


def test_megatron_settings_are_rejected_in_every_section():
    assert "Megatron-LM" in unsupported_reason("critic.megatron.tensor_model_parallel_size")
    assert "Megatron-LM" in unsupported_reason("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.strategy='megatron' is not implemented"),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "Ulysses sequence parallelism"),
        ("actor_rollout_ref.hybrid_engine=False", "hyflow always colocates"),
    ],
)
def test_a_verl_key_supported_only_at_one_value_rejects_the_others(override, expected):
    (problem,) = _problems([override])

    assert expected in problem and "Fix: set" in problem


def test_an_unsupported_key_inside_a_yaml_style_dict_is_reported_too():
    from hyflow.config.convert import default_dict

    data = default_dict()
    data["data"]["custom_cls"] = {"path": "my_dataset.py", "name": "MyDataset"}

    with pytest.raises(ConfigError, match="custom dataset classes"):
        load_config(data)


def test_renamed_keys_keep_the_part_after_the_pattern():
    assert renamed_key("ray_init.num_cpus") == "trainer.ray_init.num_cpus"
    assert renamed_key("critic.optim.warmup_style") == "critic.optim.lr_scheduler_type"
    assert renamed_key("data.train_files") is None


def test_ignored_keys_cover_everything_below_them():
    assert ignored_reason("actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend") is not None
    assert ignored_reason("actor_rollout_ref.rollout.n") is None


def test_a_verl_feature_hyflow_lacks_is_accepted_when_the_script_switches_it_off(caplog):
    with caplog.at_level(logging.WARNING, logger="hyflow.config"):
        config = load_config(["+actor_rollout_ref.model.use_liger=False", "+algorithm.use_pf_ppo=False"])

    assert isinstance(config, PPOTrainerConfig)
    assert any("ignoring actor_rollout_ref.model.use_liger=False" in r.getMessage() for r in caplog.records)
