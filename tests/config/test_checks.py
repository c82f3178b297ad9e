"""Cross-field rules: batch arithmetic, estimators that need groups or a critic, cluster shape, files."""

import logging

import pytest

from hyflow.config import ConfigError, load_config

GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4"]


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    return caught.value.problems


def test_train_batch_that_does_not_split_into_mini_batches_is_rejected():
    (problem,) = _problems(["data.train_batch_size=100", "actor_rollout_ref.actor.ppo_mini_batch_size=64"])

    assert "data.train_batch_size=100 must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size=64" in problem
    assert "Fix:" in problem


def test_mini_batch_larger_than_the_train_batch_is_rejected():
    (problem,) = _problems(["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=64"])

    assert "actor_rollout_ref.actor.ppo_mini_batch_size=64 is larger than data.train_batch_size=32" in problem


def test_step_batch_that_does_not_split_over_the_devices_is_rejected():
    problems = _problems(
        ["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=3", "trainer.n_gpus_per_node=4"]
    )

    assert any("6 samples per step must divide evenly over the data-parallel size 4" in p for p in problems)


def test_micro_batch_that_does_not_divide_the_per_device_mini_batch_is_rejected():
    (problem,) = _problems(
        [
            *GRPO,
            "data.train_batch_size=16",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",
            "trainer.n_gpus_per_node=2",
        ]
    )

    assert problem.startswith("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5 must divide")
    assert "8 * 4 / 2 = 16 samples" in problem


def test_micro_batch_larger_than_the_mini_batch_is_rejected():
    mini_batch = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
    (problem,) = _problems([*mini_batch, "critic.ppo_micro_batch_size_per_gpu=8"])

    assert problem.startswith("critic.ppo_micro_batch_size_per_gpu=8 must divide")
    assert "(mini-batch >= micro-batch)" in problem


def test_dynamic_batch_size_skips_the_micro_batch_rule_but_needs_room_for_one_sample():
    (problem,) = _problems(
        [
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100",
        ]
    )

    assert problem.startswith("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100 is smaller than one sample")


def test_global_and_per_device_micro_batch_sizes_together_are_rejected():
    (problem,) = _problems(
        ["actor_rollout_ref.actor.ppo_micro_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]
    )

    assert "You have set both" in problem and "they say the same thing" in problem


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "grpo_passk", "reinforce_plus_plus_baseline", "opo", "gpg"])
def test_group_estimators_need_more_than_one_sample_per_prompt(estimator):
    (problem,) = _problems([f"algorithm.adv_estimator={estimator}"])

    assert f"algorithm.adv_estimator='{estimator}' compares the samples of each prompt" in problem
    assert "actor_rollout_ref.rollout.n=1" in problem and "Fix: set actor_rollout_ref.rollout.n to 2" in problem


def test_gae_without_a_critic_is_rejected():
    (problem,) = _problems(["critic.enable=False"])

    assert problem.startswith("algorithm.adv_estimator='gae' needs a critic")


def test_grpo_turns_the_critic_off_and_gae_turns_it_on():
    assert not load_config(GRPO).use_critic
    assert load_config([]).use_critic


def test_an_unregistered_estimator_lists_the_registered_ones():
    (problem,) = _problems(["algorithm.adv_estimator=grpoo"])

    assert "algorithm.adv_estimator='grpoo' is not a registered advantage estimator" in problem
    assert "grpo, grpo_passk" in problem and "@register_adv_est('grpoo')" in problem


def test_an_unregistered_policy_loss_lists_the_registered_ones():
    (problem,) = _problems(["actor_rollout_ref.actor.policy_loss.loss_mode=ppo"])

    assert "loss_mode='ppo' is not a registered policy loss" in problem and "vanilla" in problem


def test_kl_as_a_loss_and_in_the_reward_at_once_only_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="hyflow.config"):
        load_config(["actor_rollout_ref.actor.use_kl_loss=True", "algorithm.use_kl_in_reward=True"])

    assert any("counted twice" in r.getMessage() for r in caplog.records)


def test_local_backend_runs_only_one_process():
    (problem,) = _problems(["trainer.backend=local", "trainer.n_gpus_per_node=2"])

    assert problem.startswith("trainer.backend='local' runs one process")


def test_tensor_parallel_size_must_divide_the_devices():
    (problem,) = _problems(["actor_rollout_ref.rollout.tensor_model_parallel_size=2"])

    assert "tensor_model_parallel_size=2 must divide the number of devices 1" in problem


def test_a_tensor_parallel_engine_may_not_span_two_nodes():
    overrides = ["trainer.backend=ray", "trainer.nnodes=2", "trainer.n_gpus_per_node=2"]
    (problem,) = _problems([*overrides, "actor_rollout_ref.rollout.tensor_model_parallel_size=4"])

    assert "must divide trainer.n_gpus_per_node=2, so that no engine spans two nodes" in problem


def test_multi_turn_rollouts_need_tensor_parallel_size_one():
    overrides = [
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "data.return_raw_chat=True",
    ]
    problems = _problems([*overrides, "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])

    assert any("multi_turn.enable=True: agent loops use the engine's per-request API" in p for p in problems)
    assert load_config(overrides).actor_rollout_ref.rollout.multi_turn.enable  # fine with tensor_model_parallel_size=1


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor_rollout_ref.rollout.top_p=0", "top_p=0.0 must be in (0, 1]"),
        ("actor_rollout_ref.rollout.temperature=-1", "temperature=-1.0 must be 0 or more"),
        ("actor_rollout_ref.actor.clip_ratio_c=1", "clip_ratio_c=1.0 must be above 1"),
        ("trainer.save_freq=0", "trainer.save_freq=0 must be positive (> 0) or -1"),
        ("actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n=0 must be positive"),
    ],
)
def test_values_out_of_range_are_rejected(override, expected):
    problems = _problems([override])

    assert any(expected in p for p in problems)


def test_settings_that_need_a_companion_key_say_which(tmp_path):
    problems = _problems(
        [
            "trainer.resume_mode=resume_path",
            "reward_model.enable=True",
            "algorithm.filter_groups.enable=True",
            f"custom_reward_function.path={tmp_path / 'missing.py'}",
        ]
    )

    assert len(problems) == 4
    assert any("needs trainer.resume_from_path" in p for p in problems)
    assert any("needs reward_model.model.path" in p for p in problems)
    assert any("needs algorithm.filter_groups.metric" in p for p in problems)
    assert any("custom_reward_function.path=" in p and "is not a file" in p for p in problems)


def test_forcing_the_old_log_prob_pass_off_where_the_update_needs_it_is_rejected():
    (problem,) = _problems(
        [
            *GRPO,
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "algorithm.use_kl_in_reward=True",
            "actor_rollout_ref.actor.recompute_old_log_prob=False",
        ]
    )

    assert problem.startswith("actor_rollout_ref.actor.recompute_old_log_prob=False skips the old-log-prob pass")
    assert "ppo_mini_batch_size=4 is below data.train_batch_size=8" in problem
    assert "algorithm.use_kl_in_reward=True" in problem
    assert "Fix: set actor_rollout_ref.actor.recompute_old_log_prob=auto" in problem


def test_a_recompute_old_log_prob_that_is_neither_auto_nor_a_bool_is_rejected():
    (problem,) = _problems(["actor_rollout_ref.actor.recompute_old_log_prob=sometimes"])

    assert "actor_rollout_ref.actor.recompute_old_log_prob='sometimes'" in problem
    assert "'auto' or true or false" in problem


def test_validation_only_without_validation_files_is_rejected_at_load():
    (problem,) = _problems([*GRPO, "trainer.val_only=True"])

    assert "trainer.val_only=True validates without training, but data.val_files is not set" in problem


def test_agent_loops_without_the_raw_chat_are_rejected_at_load_with_the_fix():
    (problem,) = _problems([*GRPO, "actor_rollout_ref.rollout.multi_turn.enable=True"])

    assert "multi_turn.enable=True: agent loops read the chat messages" in problem
    assert problem.endswith("Fix: set data.return_raw_chat=True.")
    assert load_config([*GRPO, "actor_rollout_ref.rollout.multi_turn.enable=True", "data.return_raw_chat=True"])


def test_the_backend_is_local_for_a_one_process_run_and_ray_for_more():
    assert load_config(GRPO).trainer.backend == "local"  # the default: auto, one device
    assert load_config([*GRPO, "trainer.n_gpus_per_node=2"]).trainer.backend == "ray"
    assert load_config([*GRPO, "trainer.backend=ray"]).trainer.backend == "ray"  # explicit wins


def test_the_ray_backend_without_ray_installed_names_both_fixes(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real_find_spec(name, *a)
    )

    (problem,) = _problems([*GRPO, "trainer.n_gpus_per_node=2"])

    assert "trainer.backend='ray' needs Ray, which is not installed" in problem
    assert "pip install 'hyflow[ray]'" in problem and "trainer.backend=local" in problem
