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


def test_every_key_of_verls_generated_config_is_implemented_mapped_ignored_or_named():
    from hyflow.config.convert import resolve_key
    from hyflow.config.verl_compat import verl_keys

    unknown = [key for key, default in verl_keys().items() if "not a hyflow" in resolve_key(key, default).message]

    assert len(verl_keys()) > 800 and unknown == []


# Written for these tests in the style of verl's example scripts (v0.7-v0.9 spellings), not copied from them.
VERL_STYLE_OVERRIDES = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=16",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.nccl_timeout=1800",
    "actor_rollout_ref.actor.optim.clip_grad=0.5",
    "critic.optim.clip_grad=2.0",
    "actor_rollout_ref.actor.fsdp_config.use_orig_params=True",
    "actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16",
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.actor.profiler.enable=True",
    "actor_rollout_ref.actor.optim.optimizer=AdamW",
    "actor_rollout_ref.rollout.data_parallel_size=2",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096",
    "actor_rollout_ref.model.lora_adapter_path=/adapters/grpo-step-100",
    "critic.fsdp.param_offload=True",
    "reward_model.use_reward_loop=True",
    "reward_model.num_workers=4",
    "reward_model.rollout.name=vllm",
    "reward_model.rollout.gpu_memory_utilization=0.3",
    "reward_model.rollout.prompt_length=2048",
    "reward.reward_manager.name=dapo",
    "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward.reward_kwargs.overlong_buffer_cfg.len=64",
    "ray_kwargs.ray_init.num_cpus=4",
    "trainer.use_v1=True",
]


def test_a_verl_style_launch_line_loads_and_lands_on_hyflows_keys(caplog):
    with caplog.at_level(logging.WARNING, logger="hyflow.config"):
        config = load_config(VERL_STYLE_OVERRIDES)

    arr = config.actor_rollout_ref
    assert arr.nccl_timeout == 1800
    assert arr.actor.grad_clip == 0.5 and config.critic.grad_clip == 2.0
    assert arr.actor.fsdp_config.model_dtype == "bf16"
    assert arr.model.lora_adapter_path == "/adapters/grpo-step-100"
    assert config.critic.model.fsdp_config.param_offload is True
    assert config.reward_model.reward_manager == "dapo"
    assert config.reward_model.overlong_buffer.enable is True and config.reward_model.overlong_buffer.len == 64
    assert config.trainer.ray_init.num_cpus == 4
    notices = " ".join(r.getMessage() for r in caplog.records)
    for ignored in ("use_orig_params", "profiler.enable", "data_parallel_size", "use_reward_loop", "rollout.name"):
        assert ignored in notices
    assert "Ulysses sequence parallelism (size 2) for actor_rollout_ref.actor" in notices


def test_clip_grad_in_a_yaml_style_dict_moves_to_the_sections_grad_clip():
    from hyflow.config.convert import default_dict

    data = default_dict()
    data["actor_rollout_ref"]["actor"]["optim"]["clip_grad"] = 0.25

    assert load_config(data).actor_rollout_ref.actor.grad_clip == 0.25


def test_a_verl_feature_hyflow_lacks_is_accepted_at_verls_default_and_rejected_otherwise():
    config = load_config(
        ["actor_rollout_ref.actor.optim.optimizer=AdamW", "actor_rollout_ref.rollout.logprobs_mode=processed_logprobs"]
    )
    assert isinstance(config, PPOTrainerConfig)

    (problem,) = _problems(["actor_rollout_ref.actor.optim.optimizer=SGD"])
    assert "optimizers other than AdamW" in problem and "Fix: remove" in problem


def test_verls_newer_reward_section_reaches_the_reward_model_and_custom_function(tmp_path):
    score_file = tmp_path / "score.py"
    score_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    config = load_config(
        [
            "reward.reward_model.enable=True",
            "reward.reward_model.model_path=/models/rm",
            f"reward.custom_reward_function.path={score_file}",
        ],
        check_files=False,  # /models/rm is a cluster's folder
    )

    assert config.reward_model.enable is True and config.reward_model.model.path == "/models/rm"
    assert config.custom_reward_function.path == str(score_file)


def test_lora_for_the_critic_is_rejected_instead_of_dropped():
    problems = _problems(["critic.model.lora_rank=8", "critic.model.lora_adapter_path=/adapters/critic"])

    assert len(problems) == 2 and all("LoRA for the critic" in p for p in problems)


def test_pf_ppo_keys_load_as_hyflow_keys():
    config = load_config(
        ["algorithm.use_pf_ppo=True", "algorithm.pf_ppo.reweight_method=max_min", "algorithm.pf_ppo.weight_pow=3.0"]
    )

    assert config.algorithm.use_pf_ppo is True and config.algorithm.pf_ppo.reweight_method == "max_min"


def test_verls_rollout_moe_load_balance_metrics_interval_sets_the_actors():
    config = load_config(["+actor_rollout_ref.rollout.moe_load_balance_metrics_interval=5"])

    assert config.actor_rollout_ref.actor.moe_load_balance_metrics_interval == 5
