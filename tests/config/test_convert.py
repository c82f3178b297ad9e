"""Key and type checking: unknown keys with suggestions, wrong types, values outside their choices, defaults."""

import dataclasses

import pytest

from hyflow.config import ConfigError, PPOTrainerConfig, load_config
from hyflow.config.convert import default_dict, describe_type, resolve_key, suggest_key


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    return caught.value.problems


def test_a_misspelled_key_names_the_closest_valid_key():
    (problem,) = _problems(["data.train_batchsize=8"])

    assert "unknown key 'data.train_batchsize'" in problem
    assert "Did you mean 'data.train_batch_size'?" in problem
    assert "data.train_batchsize=8" in problem  # the override as given


def test_a_key_in_the_wrong_section_points_to_the_section_that_has_it():
    assert suggest_key("actor_rollout_ref.actor.n") == "actor_rollout_ref.rollout.n"


def test_a_hopeless_key_lists_the_valid_keys_at_its_level():
    (problem,) = _problems(["zzz=1"])

    assert "Valid keys under the root: actor_rollout_ref, algorithm, async_training, critic" in problem


def test_a_key_below_a_plain_value_is_reported_as_not_a_section():
    status = resolve_key("data.max_prompt_length.extra")

    assert status.kind == "invalid"
    assert "'data.max_prompt_length' is a value, not a section" in status.message


def test_a_wrong_type_names_key_value_expected_type_and_default():
    (problem,) = _problems(["data.train_batch_size=abc"])

    assert problem == (
        "data.train_batch_size='abc' has the wrong type: expected an integer, got str. "
        "Fix: set data.train_batch_size to an integer (default: data.train_batch_size=1024)."
    )


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor_rollout_ref.actor.use_kl_loss=maybe", "expected true or false"),
        ("actor_rollout_ref.rollout.n=2.5", "expected an integer"),
        ("actor_rollout_ref.actor.optim.lr=fast", "expected a number"),
        ("actor_rollout_ref.model.override_config=3", "expected a mapping"),
        ("trainer.logger=[1]", "trainer.logger[0]=1 is not an allowed value"),
    ],
)
def test_each_scalar_type_is_checked(override, expected):
    (problem,) = _problems([override])

    assert expected in problem


def test_a_value_outside_its_choices_lists_the_allowed_values():
    (problem,) = _problems(["data.truncation=center"])

    assert problem == (
        "data.truncation='center' is not an allowed value. Allowed values: 'error', 'left', 'right', 'middle'. "
        "Fix: pick one of them."
    )


def test_an_integer_is_accepted_where_a_number_is_expected_and_a_number_where_a_string_is():
    config = load_config(["actor_rollout_ref.actor.optim.lr=1", "trainer.experiment_name=2024"])

    assert config.actor_rollout_ref.actor.optim.lr == 1.0 and isinstance(config.actor_rollout_ref.actor.optim.lr, float)
    assert config.trainer.experiment_name == "2024"


def test_describe_type_reads_like_prose():
    assert describe_type(int | None) == "an integer or null"
    assert describe_type(list[str]) == "a list of (a string)"


def test_the_defaults_are_the_dataclass_defaults_with_inherited_keys_left_for_finalize():
    defaults = default_dict()

    assert set(defaults) == {f.name for f in dataclasses.fields(PPOTrainerConfig)}
    assert defaults["data"]["max_prompt_length"] == 512
    assert defaults["actor_rollout_ref"]["rollout"]["prompt_length"] is None  # = data.max_prompt_length, later
    assert "${" not in repr(defaults)


def test_the_defaults_alone_load_into_the_same_values_as_the_dataclasses():
    loaded = load_config([])
    built = PPOTrainerConfig()

    # the values filled at load: no micro-batch size given means the whole per-device mini-batch; rollout_n
    # inherits actor_rollout_ref.rollout.n
    filled = dataclasses.replace(built.actor_rollout_ref.actor, ppo_micro_batch_size_per_gpu=256, rollout_n=1)
    assert loaded.actor_rollout_ref.actor == filled
    assert loaded.data == built.data
    assert loaded.algorithm == built.algorithm


# Keys named by the issues (verl's quickstart and GRPO lines, the engine, data and trainer issues), by section.
ISSUE_KEYS_BY_SECTION = {
    "data": (
        "train_files val_files train_batch_size max_prompt_length max_response_length filter_overlong_prompts "
        "truncation prompt_key reward_fn_key val_batch_size return_raw_chat shuffle seed train_max_samples "
        "val_max_samples apply_chat_template_kwargs dataloader_num_workers"
    ),
    "actor_rollout_ref.model": (
        "path use_remove_padding lora_rank enable_gradient_checkpointing lora_alpha target_modules "
        "override_config trust_remote_code tokenizer_path"
    ),
    "actor_rollout_ref.actor.optim": (
        "lr betas weight_decay lr_warmup_steps lr_warmup_steps_ratio lr_scheduler_type min_lr_ratio "
        "total_training_steps"
    ),
    "actor_rollout_ref.actor": (
        "ppo_mini_batch_size ppo_micro_batch_size_per_gpu use_kl_loss kl_loss_coef kl_loss_type entropy_coeff "
        "ppo_epochs shuffle use_dynamic_bsz ppo_max_token_len_per_gpu grad_clip clip_ratio clip_ratio_low "
        "clip_ratio_high clip_ratio_c loss_agg_mode checkpoint"
    ),
    "actor_rollout_ref.actor.fsdp_config": "param_offload optimizer_offload model_dtype mixed_precision",
    "actor_rollout_ref.actor.policy_loss": "loss_mode",
    "actor_rollout_ref.rollout": (
        "name n temperature top_p top_k do_sample prompt_length response_length max_num_batched_tokens "
        "max_num_seqs enforce_eager free_cache_engine ignore_eos mode calculate_log_probs "
        "log_prob_micro_batch_size_per_gpu log_prob_use_dynamic_bsz log_prob_max_token_len_per_gpu "
        "tensor_model_parallel_size gpu_memory_utilization"
    ),
    "actor_rollout_ref.rollout.val_kwargs": "temperature",
    "actor_rollout_ref.rollout.multi_turn": (
        "enable format max_assistant_turns max_user_turns max_parallel_calls max_tool_response_length "
        "tool_response_truncate_side tool_config_path interaction_config_path"
    ),
    "actor_rollout_ref.rollout.agent": "num_workers",
    "actor_rollout_ref.ref": "log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.fsdp_config": "param_offload",
    "critic.optim": "lr",
    "critic.model": "path",
    "critic": "ppo_micro_batch_size_per_gpu cliprange_value",
    "reward_model": "enable reward_manager micro_batch_size_per_gpu num_processes timeout reward_functions",
    "reward_model.model": "path",
    "reward_model.overlong_buffer": "len",
    "custom_reward_function": "path name reward_kwargs",
    "algorithm": "adv_estimator gamma lam norm_adv_by_std_in_grpo use_kl_in_reward kl_penalty",
    "algorithm.kl_ctrl": "type kl_coef horizon target_kl",
    "algorithm.filter_groups": "enable",
    "trainer": (
        "backend critic_warmup logger project_name experiment_name nnodes n_gpus_per_node device save_freq "
        "test_freq total_epochs total_training_steps val_before_train default_local_dir resume_mode "
        "resume_from_path max_actor_ckpt_to_keep max_critic_ckpt_to_keep balance_batch rollout_data_dir seed"
    ),
    "trainer.ray_init": "num_cpus address",
}
ISSUE_KEYS = [f"{section}.{name}" for section, names in ISSUE_KEYS_BY_SECTION.items() for name in names.split()]


@pytest.mark.parametrize("key", ISSUE_KEYS)
def test_every_key_the_issues_name_exists(key):
    assert resolve_key(key).kind == "ok"
