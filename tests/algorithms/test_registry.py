import pytest
import torch

from hyflow.algorithms import (
    AdvantageEstimator,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)


@register_adv_est("test_registry_constant_est")
def constant_estimator(token_level_rewards, response_mask, **kwargs):
    advantages = torch.full_like(token_level_rewards, 2.0) * response_mask
    return advantages, advantages


@register_policy_loss("test_registry_reward_weighted")
def reward_weighted_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **kwargs):
    rewards = kwargs["token_level_rewards"]
    loss = -(log_prob * rewards * response_mask).sum()
    return loss, {"reward_sum": rewards.sum().detach()}


def test_a_custom_estimator_registered_in_user_code_is_found_by_name():
    fn = get_adv_estimator_fn("test_registry_constant_est")
    assert fn is constant_estimator
    advantages, _ = fn(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3), index=None, gamma=1.0)
    assert torch.equal(advantages, torch.full((2, 3), 2.0))


def test_a_custom_policy_loss_is_found_by_name_and_receives_extra_batch_fields():
    fn = get_policy_loss_fn("test_registry_reward_weighted")
    log_prob = torch.zeros(1, 2, requires_grad=True)
    loss, metrics = fn(
        old_log_prob=torch.zeros(1, 2),
        log_prob=log_prob,
        advantages=torch.zeros(1, 2),
        response_mask=torch.ones(1, 2),
        loss_agg_mode="token-mean",
        config=None,
        token_level_rewards=torch.tensor([[0.0, 3.0]]),
    )
    loss.backward()
    assert torch.equal(log_prob.grad, torch.tensor([[0.0, -3.0]]))
    assert metrics["reward_sum"].item() == 3.0


def test_built_in_estimators_are_found_by_enum_and_by_string():
    for member in AdvantageEstimator:
        assert get_adv_estimator_fn(member) is get_adv_estimator_fn(member.value)


def test_registering_the_same_function_again_is_allowed():
    assert register_adv_est("test_registry_constant_est")(constant_estimator) is constant_estimator


def test_registering_a_different_function_under_a_taken_name_raises():
    def another(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards, token_level_rewards

    with pytest.raises(ValueError, match="already registered"):
        register_adv_est(AdvantageEstimator.GRPO)(another)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(another)


def test_unknown_names_raise_errors_that_list_the_registered_names():
    with pytest.raises(ValueError, match=r"algorithm\.adv_estimator='nope'.*'gae'.*'grpo'"):
        get_adv_estimator_fn("nope")
    with pytest.raises(ValueError, match=r"loss_mode='nope'.*'gspo'.*'vanilla'"):
        get_policy_loss_fn("nope")


def test_the_registries_read_and_edit_like_verls_dicts():
    from hyflow.algorithms import ADV_ESTIMATOR_REGISTRY, compute_grpo_outcome_advantage

    assert ADV_ESTIMATOR_REGISTRY["grpo"] is compute_grpo_outcome_advantage
    assert "gae" in ADV_ESTIMATOR_REGISTRY and "gae" in list(ADV_ESTIMATOR_REGISTRY)
    assert ADV_ESTIMATOR_REGISTRY.get("no_such_estimator") is None
    before = len(ADV_ESTIMATOR_REGISTRY)
    ADV_ESTIMATOR_REGISTRY["doubled"] = compute_grpo_outcome_advantage
    try:
        assert len(ADV_ESTIMATOR_REGISTRY) == before + 1
    finally:
        del ADV_ESTIMATOR_REGISTRY["doubled"]
    assert "doubled" not in ADV_ESTIMATOR_REGISTRY


def test_verls_vectorized_estimator_names_select_the_same_vectorised_estimators():
    from hyflow.algorithms import (
        compute_grpo_outcome_advantage,
        compute_grpo_vectorized_outcome_advantage,
        compute_rloo_outcome_advantage,
        get_adv_estimator_fn,
    )

    assert get_adv_estimator_fn("grpo_vectorized") is compute_grpo_outcome_advantage
    assert get_adv_estimator_fn("rloo_vectorized") is compute_rloo_outcome_advantage
    assert compute_grpo_vectorized_outcome_advantage is compute_grpo_outcome_advantage


def test_a_registry_rebound_to_a_plain_dict_receives_registrations_and_lookups(monkeypatch):
    from hyflow.algorithms import registry

    replacement = {"gae": lambda x: x * 2}
    monkeypatch.setattr(registry, "ADV_ESTIMATOR_REGISTRY", replacement)

    @register_adv_est("test_rebound")
    def rebound(x):
        return x

    assert replacement["test_rebound"] is rebound
    assert get_adv_estimator_fn("gae")(5) == 10
    with pytest.raises(ValueError, match=r"Registered: \['gae', 'test_rebound'\]"):
        get_adv_estimator_fn("missing")
