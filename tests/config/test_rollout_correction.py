"""`algorithm.rollout_correction.*`: verl's keys load, bad settings are problems naming the key, modes pick passes."""

import pytest

from hyflow.config import ConfigError, load_config

KEY = "algorithm.rollout_correction"
LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=True"
ONE_STEP_PER_BATCH = ["data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=64"]


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    return caught.value.problems


def test_verl_keys_load_into_the_typed_section():
    keys = ["rollout_is=sequence", "rollout_is_threshold=5.0", "rollout_rs=seq_max_k2", "rollout_rs_threshold=0.01"]
    config = load_config([LOG_PROBS, *(f"{KEY}.{key}" for key in keys), f"{KEY}.rollout_is_batch_normalize=True"])
    correction = config.algorithm.rollout_correction
    assert (correction.rollout_is, correction.rollout_is_threshold, correction.rollout_is_batch_normalize) == (
        "sequence",
        5.0,
        True,
    )
    assert float(correction.rollout_rs_threshold) == 0.01 and not correction.bypass_mode


def test_a_correction_without_the_engine_log_probs_is_a_problem_naming_both_keys():
    (problem,) = _problems([f"{KEY}.rollout_is=token"])
    assert KEY in problem and "actor_rollout_ref.rollout.calculate_log_probs=True" in problem


def test_bad_thresholds_and_options_are_reported_together_with_their_keys():
    problems = _problems(
        [LOG_PROBS, f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold=0", f"{KEY}.rollout_rs=tok"]
    )
    assert len(problems) == 2
    assert f"{KEY}.rollout_is_threshold=0.0 must be positive" in problems[0]
    assert f"{KEY}.rollout_rs='tok'" in problems[1] and "token_k1" in problems[1]


@pytest.mark.parametrize(
    ("options", "thresholds", "message"),
    [
        ("token_k1", None, "needs algorithm.rollout_correction.rollout_rs_threshold"),
        ("token_k1", "2.0_0.5", "'lower_upper'"),
        ("token_k2,seq_max_k3", "0.1,0.2,0.3", "3 entries for 2 option(s)"),
        ("seq_mean_k3", "-1", "positive upper bound"),
    ],
)
def test_rejection_thresholds_that_do_not_parse_are_problems(options, thresholds, message):
    overrides = [LOG_PROBS, f"{KEY}.rollout_rs='{options}'"]  # quoted: a comma is a Hydra sweep
    if thresholds is not None:
        overrides.append(f"{KEY}.rollout_rs_threshold='{thresholds}'")
    (problem,) = _problems(overrides)
    assert message in problem and "Fix:" in problem


def test_decoupled_mode_needs_the_old_log_prob_pass_even_for_one_optimizer_step_per_batch():
    plain = load_config(ONE_STEP_PER_BATCH)
    corrected = load_config([*ONE_STEP_PER_BATCH, LOG_PROBS, f"{KEY}.rollout_is=token"])
    assert plain.recompute_old_log_prob is False
    assert corrected.recompute_old_log_prob is True
    assert any(KEY in reason for reason in corrected.old_log_prob_pass_reasons())


def test_bypass_mode_skips_the_old_log_prob_pass_even_over_several_epochs():
    config = load_config([LOG_PROBS, f"{KEY}.bypass_mode=True", "actor_rollout_ref.actor.ppo_epochs=2"])
    assert config.recompute_old_log_prob is False and config.old_log_prob_pass_reasons() == []
    (problem,) = _problems(
        [LOG_PROBS, f"{KEY}.bypass_mode=True", "actor_rollout_ref.actor.recompute_old_log_prob=True"]
    )
    assert "recompute_old_log_prob=True" in problem


def test_bypass_mode_with_reinforce_trains_with_the_reinforce_is_loss():
    config = load_config(
        [LOG_PROBS, f"{KEY}.bypass_mode=True", f"{KEY}.loss_type=reinforce", f"{KEY}.rollout_is=token"]
    )
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "reinforce_is"
    (problem,) = _problems(
        [
            LOG_PROBS,
            f"{KEY}.bypass_mode=True",
            f"{KEY}.loss_type=reinforce",
            "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        ]
    )
    assert "loss_mode='gspo'" in problem


def test_settings_that_would_do_nothing_are_problems():
    (bypass_clip,) = _problems([LOG_PROBS, f"{KEY}.bypass_mode=True", f"{KEY}.rollout_is=token"])
    assert "loss_type='ppo_clip'" in bypass_clip and "loss_type=reinforce" in bypass_clip
    (reinforce_alone,) = _problems([f"{KEY}.loss_type=reinforce"])
    assert "bypass_mode=False" in reinforce_alone


def test_icepop_bounds_load_as_the_is_threshold_and_bad_bounds_are_a_problem_naming_the_key():
    icepop = [LOG_PROBS, f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold='0.5_5.0'"]
    assert load_config(icepop).algorithm.rollout_correction.rollout_is_threshold == "0.5_5.0"
    (problem,) = _problems([LOG_PROBS, f"{KEY}.rollout_is=token", f"{KEY}.rollout_is_threshold='5.0_0.5'"])
    assert f"{KEY}.rollout_is_threshold='5.0_0.5'" in problem and "Fix:" in problem
