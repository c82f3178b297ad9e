"""`PPOTrainerConfig`'s derived facts: when the old-log-prob pass runs (`recompute_old_log_prob`), where the
tokenizer comes from (`tokenizer_source`)."""

import pytest

from hyflow.config import PPOTrainerConfig, load_config

# One optimizer step per batch: 8 prompts × 4 samples, the whole batch one mini-batch, one epoch.
ON_POLICY = [
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=4",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
]


def test_auto_skips_the_old_log_prob_pass_when_each_batch_gets_one_optimizer_step():
    config = load_config(ON_POLICY)

    assert config.actor_rollout_ref.actor.recompute_old_log_prob == "auto"
    assert config.old_log_prob_pass_reasons() == []
    assert config.recompute_old_log_prob is False


def test_auto_skips_the_pass_with_a_kl_loss_critic_warmup_and_rollout_log_probs_in_the_loss():
    extra = [
        "actor_rollout_ref.actor.use_kl_loss=True",  # the KL loss reads log_prob and ref_log_prob, not old
        "trainer.critic_warmup=2",  # warm-up steps have no actor update, so nothing reads old_log_probs
        "actor_rollout_ref.rollout.calculate_log_probs=True",  # the loss sees old_log_prob = log_prob either way
    ]
    assert load_config([*ON_POLICY, *extra]).recompute_old_log_prob is False


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ("actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_epochs=2"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size=4", "ppo_mini_batch_size=4 is below data.train_batch_size=8"),
        ("algorithm.use_kl_in_reward=True", "algorithm.use_kl_in_reward=True"),
        ("actor_rollout_ref.actor.policy_loss.extra_batch_keys=[old_log_probs]", "extra_batch_keys names"),
    ],
)
def test_auto_recomputes_the_old_log_probs_when_the_update_needs_them(override, reason):
    config = load_config([*ON_POLICY, override])

    (found,) = config.old_log_prob_pass_reasons()
    assert reason in found
    assert config.recompute_old_log_prob is True


def test_true_always_recomputes_and_false_skips_where_that_is_safe():
    assert load_config([*ON_POLICY, "actor_rollout_ref.actor.recompute_old_log_prob=True"]).recompute_old_log_prob
    forced = load_config([*ON_POLICY, "actor_rollout_ref.actor.recompute_old_log_prob=False"])
    assert forced.recompute_old_log_prob is False


def test_the_tokenizer_comes_from_data_tokenizer_then_tokenizer_path_then_the_model_folder():
    config = PPOTrainerConfig()
    assert config.tokenizer_source == ("", None)
    config.actor_rollout_ref.model.path = "/models/qwen"
    assert config.tokenizer_source == ("actor_rollout_ref.model.path", "/models/qwen")
    config.actor_rollout_ref.model.tokenizer_path = "/models/qwen-tokenizer"
    assert config.tokenizer_source == ("actor_rollout_ref.model.tokenizer_path", "/models/qwen-tokenizer")
    config.data.tokenizer = "/data/tokenizer"
    assert config.tokenizer_source == ("data.tokenizer", "/data/tokenizer")
