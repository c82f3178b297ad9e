"""verl's engine-level config classes: hyflow's sections with verl's fields, checked and frozen when built."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from hyflow.config import FSDPConfig, ModelConfig, OptimConfig
from hyflow.config.verl_engine import (
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    HFModelConfig,
    McoreEngineConfig,
    McoreOptimizerConfig,
    OptimizerConfig,
)


def test_verl_sections_are_hyflows_sections_with_hyflows_defaults():
    assert isinstance(FSDPOptimizerConfig(), OptimConfig) and isinstance(FSDPEngineConfig(), FSDPConfig)
    assert isinstance(HFModelConfig(), ModelConfig)
    assert FSDPOptimizerConfig().weight_decay == OptimConfig().weight_decay
    assert FSDPEngineConfig().fsdp_size == FSDPConfig().fsdp_size == -1


def test_a_value_outside_the_choices_is_a_value_error_naming_the_allowed_ones():
    with pytest.raises(ValueError, match=r"Invalid lr_scheduler_type.*Allowed values: 'constant', 'cosine'"):
        FSDPOptimizerConfig(lr_scheduler_type="linear")


def test_a_value_of_the_wrong_type_is_a_type_error_even_where_the_command_line_would_convert_it():
    with pytest.raises(TypeError, match="Invalid target_modules for HFModelConfig"):
        HFModelConfig(target_modules=[1, 2])
    with pytest.raises(TypeError, match="Invalid lr"):
        OptimizerConfig(lr="fast")
    assert OptimizerConfig(betas=(0.9, 0.95)).betas == (0.9, 0.95)  # a tuple is a sequence too


def test_verls_older_names_are_read_as_the_new_ones():
    assert FSDPOptimizerConfig(warmup_style="cosine").lr_scheduler_type == "cosine"
    assert OptimizerConfig(grad_clip=0.5).clip_grad == 0.5
    assert FSDPOptimizerConfig().effective_min_lr_ratio == 0.0


def test_only_verls_mutable_fields_change_after_construction():
    optim = FSDPOptimizerConfig()
    optim.total_training_steps = 100
    with pytest.raises(dataclasses.FrozenInstanceError):
        optim.lr = 1.0
    engine = FSDPEngineConfig()
    engine.param_offload = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        engine.fsdp_size = 2


def test_megatron_sequence_parallelism_is_off_without_tensor_parallelism():
    assert McoreEngineConfig().sequence_parallel is False
    assert McoreEngineConfig(tensor_model_parallel_size=2).sequence_parallel is True
    with pytest.raises(ValueError, match="pipeline_model_parallel_size=0 must be >= 1"):
        McoreEngineConfig(pipeline_model_parallel_size=0)
    with pytest.raises(ValueError, match="Invalid exp_avg_dtype"):
        McoreOptimizerConfig(exp_avg_dtype="fp8")


def test_hf_model_config_merges_a_list_or_a_string_of_target_modules_through_omegaconf():
    schema = OmegaConf.structured(HFModelConfig)
    for modules in (["q_proj", "v_proj"], "all-linear", None):
        merged = OmegaConf.to_object(OmegaConf.merge(schema, {"path": "/m", "target_modules": modules}))
        assert merged.target_modules == modules
