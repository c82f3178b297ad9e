import math
from types import SimpleNamespace

import pytest
import torch

from hyflow.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty_to_rewards,
    get_kl_controller,
    kl_penalty,
)

NAIVE_KL = {
    "kl": lambda x: x,
    "k1": lambda x: x,
    "abs": abs,
    "mse": lambda x: 0.5 * x * x,
    "k2": lambda x: 0.5 * x * x,
    "low_var_kl": lambda x: math.exp(-x) + x - 1,
    "k3": lambda x: math.exp(-x) + x - 1,
}


@pytest.mark.parametrize("kind", sorted(NAIVE_KL))
def test_kl_penalty_matches_the_estimator_formula(kind):
    torch.manual_seed(0)
    log_prob, ref = -torch.rand(3, 4) * 2, -torch.rand(3, 4) * 2
    result = kl_penalty(log_prob, ref, kind)
    for value, lp, rp in zip(result.flatten().tolist(), log_prob.flatten().tolist(), ref.flatten().tolist()):
        assert math.isclose(value, NAIVE_KL[kind](lp - rp), rel_tol=1e-5, abs_tol=1e-6)


def test_low_var_kl_is_clamped_for_stability():
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([30.0]), "k3").item() == 10.0


def test_straight_through_variant_has_the_estimators_value_and_the_k2_gradient():
    log_prob = torch.tensor([-0.3, -1.2], requires_grad=True)
    ref = torch.tensor([-0.9, -0.4])
    value = kl_penalty(log_prob, ref, "k3+")
    assert torch.allclose(value, kl_penalty(log_prob, ref, "k3"))
    (grad,) = torch.autograd.grad(value.sum(), log_prob)
    assert torch.allclose(grad, (log_prob - ref).detach())


def test_unknown_kl_estimator_raises_with_the_allowed_values():
    with pytest.raises(ValueError, match=r"kl_penalty='full'.*'low_var_kl'"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "full")


def test_adaptive_controller_follows_ziegler_et_al():
    controller = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    controller.update(current_kl=9.0, n_steps=256)  # error 0.5, clipped to 0.2
    assert math.isclose(controller.value, 0.1 * (1 + 0.2 * 256 / 10000))
    controller.update(current_kl=5.4, n_steps=100)  # error -0.1
    assert math.isclose(controller.value, 0.1 * (1 + 0.2 * 256 / 10000) * (1 - 0.1 * 100 / 10000))


def test_fixed_controller_never_changes_and_factory_builds_both_kinds():
    fixed = get_kl_controller(SimpleNamespace(type="fixed", kl_coef=0.05, horizon=0, target_kl=0.1))
    fixed.update(current_kl=100.0, n_steps=10)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    adaptive = get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.05, horizon=100, target_kl=0.1))
    assert isinstance(adaptive, AdaptiveKLController)
    with pytest.raises(ValueError, match=r"horizon=0"):
        get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.05, horizon=0, target_kl=0.1))
    with pytest.raises(ValueError, match=r"kl_ctrl\.type='pid'.*'fixed', 'adaptive'"):
        get_kl_controller(SimpleNamespace(type="pid", kl_coef=0.05, horizon=0, target_kl=0.1))


def test_kl_in_reward_subtracts_beta_times_kl_on_model_tokens():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    old, ref = (
        torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -3.0]]),
        torch.tensor([[-1.5, -2.0, -1.0], [-2.0, -1.0, 0.0]]),
    )
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards, current_kl = apply_kl_penalty_to_rewards(scores, old, ref, mask, kl_coef=0.1, kl_penalty_type="kl")
    kl = (old - ref) * mask
    assert torch.allclose(rewards, scores - 0.1 * kl)
    assert math.isclose(current_kl.item(), ((0.5 + 0 + 0.5) / 3 + (1 + 0) / 2) / 2, rel_tol=1e-6)
