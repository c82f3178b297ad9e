"""verl's `distillation` keys: the ones hyflow implements load into `config.distillation`, the others are refused
by name with the reason."""

import logging

import pytest

from hyflow.config import ConfigError, load_config

ON = [
    "distillation.enabled=True",
    "distillation.teacher_models.teacher_model.model_path=/models/teacher",
    "distillation.distillation_loss.use_policy_gradient=True",
    "distillation.distillation_loss.loss_mode=k1",
]


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides, check_files=False)
    return caught.value.problems


def test_the_policy_gradient_form_loads_with_its_clamps_and_needs_the_old_log_prob_pass():
    config = load_config(
        [
            *ON,
            "distillation.distillation_loss.loss_max_clamp=10.0",
            "distillation.distillation_loss.log_prob_min_clamp=-10.0",
            "distillation.distillation_loss.use_task_rewards=False",
            "actor_rollout_ref.actor.ppo_mini_batch_size=256",  # = data.train_batch_size: one step per batch
        ],
        check_files=False,
    )

    loss = config.distillation.distillation_loss
    assert config.distillation.teacher_path == "/models/teacher"
    assert (loss.loss_max_clamp, loss.log_prob_min_clamp, loss.use_task_rewards) == (10.0, -10.0, False)
    assert config.recompute_old_log_prob is True
    assert any(reason.startswith("distillation.enabled=True") for reason in config.old_log_prob_pass_reasons())


def test_verls_own_distillation_defaults_load_while_distillation_is_off(caplog):
    with caplog.at_level(logging.WARNING):
        config = load_config(
            [
                "distillation.teacher_key=data_source",
                "distillation.nnodes=0",
                "distillation.distillation_loss.clip_ratio_low=0.2",
                "distillation.distillation_loss.policy_loss_mode=vanilla",
                "distillation.teacher_models.teacher_model.inference.name=vllm",
                "distillation.teacher_models.teacher_model.num_replicas=0",
            ],
            check_files=False,
        )
    assert config.distillation.enabled is False
    assert "hyflow has one teacher" in caplog.text


def test_verls_default_direct_form_with_k3_loads():
    config = load_config(
        ["distillation.enabled=True", "distillation.teacher_models.teacher_model.model_path=/models/teacher"],
        check_files=False,
    )
    loss = config.distillation.distillation_loss
    assert (loss.use_policy_gradient, loss.loss_mode) == (False, "k3")


def test_k1_backpropagated_directly_is_refused_because_its_gradient_ignores_the_teacher():
    (problem,) = _problems([*ON, "distillation.distillation_loss.use_policy_gradient=False"])
    assert problem.startswith("distillation.distillation_loss.loss_mode='k1' with ")
    assert "does not depend on the teacher" in problem and "loss_mode=k3" in problem


@pytest.mark.parametrize("policy_gradient", ["True", "False"])
@pytest.mark.parametrize("mode", ["forward_kl_topk", "reverse_kl_topk", "jsd_topk"])
def test_the_top_k_loss_modes_are_refused_in_both_forms(mode, policy_gradient):
    overrides = [*ON, f"distillation.distillation_loss.loss_mode={mode}"]
    (problem,) = _problems([*overrides, f"distillation.distillation_loss.use_policy_gradient={policy_gradient}"])
    assert f"loss_mode={mode!r}" in problem and "not implemented" in problem


def test_an_estimator_other_than_k1_is_refused_in_the_policy_gradient_form():
    (problem,) = _problems([*ON, "distillation.distillation_loss.loss_mode=k3"])
    assert "policy-gradient form uses the reverse KL on the sampled token" in problem


def test_a_second_teacher_is_refused_by_name():
    (problem,) = _problems([*ON, "+distillation.teacher_models.math.model_path=/models/math"])
    assert problem.startswith("'distillation.teacher_models.math.model_path' is a verl key for several teachers")


def test_a_separate_teacher_pool_is_refused():
    (problem,) = _problems([*ON, "distillation.nnodes=1"])
    assert "a resource pool for the teacher separate from training" in problem


def test_enabling_distillation_without_a_teacher_path_is_refused():
    (problem,) = _problems([*ON[:1], *ON[2:]])
    assert "needs distillation.teacher_models.teacher_model.model_path" in problem


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("distillation.distillation_loss.loss_max_clamp=0", "loss_max_clamp=0.0 must be > 0"),
        ("distillation.distillation_loss.log_prob_min_clamp=1", "log_prob_min_clamp=1.0 must be < 0"),
        ("distillation.distillation_loss.distillation_loss_coef=-1", "distillation_loss_coef=-1.0 must be >= 0"),
    ],
)
def test_clamps_and_the_coefficient_on_the_wrong_side_of_zero_are_refused(override, expected):
    (problem,) = _problems([*ON, override])
    assert expected in problem


def test_a_missing_teacher_folder_is_reported_with_the_teachers_key():
    with pytest.raises(ConfigError) as caught:
        load_config([*ON])
    assert any(p.startswith("distillation.teacher_models.teacher_model.model_path=") for p in caught.value.problems)
