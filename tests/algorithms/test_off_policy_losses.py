"""Rollout correction inside the policy losses: `rollout_is_weights` in every registered loss, and `reinforce_is`."""

import pytest
import torch

from hyflow.algorithms import POLICY_LOSS_REGISTRY, compute_policy_loss_gpg, compute_policy_loss_reinforce_is
from hyflow.algorithms.rollout_correction import parse_rejection_rules, rejection_mask
from hyflow.config import RolloutCorrectionConfig


def _inputs(seed=0, batch=4, length=5):
    generator = torch.Generator().manual_seed(seed)
    old = torch.randn(batch, length, generator=generator) - 1.0
    new = old + 0.5 * torch.randn(batch, length, generator=generator)
    adv = torch.randn(batch, length, generator=generator)
    mask = torch.ones(batch, length)
    mask[0, 3:] = 0
    mask[2, 1:] = 0
    return old, new, adv, mask


def _loss(name, old, new, adv, mask, config, **kwargs):
    torch.manual_seed(0)  # clip_cov draws its tokens at random
    loss, _ = POLICY_LOSS_REGISTRY.get(name)(old, new, adv, mask, "token-mean", config, **kwargs)
    return loss


@pytest.mark.parametrize("name", [n for n in POLICY_LOSS_REGISTRY.names() if n != "reinforce_is"])
def test_every_registered_loss_multiplies_its_token_losses_by_the_rollout_is_weights(actor_config, name):
    old, new, adv, mask = _inputs()
    config = actor_config(clip_cov_ratio=0.2, kl_cov_ratio=0.2)
    plain = _loss(name, old, new, adv, mask, config)
    assert torch.equal(_loss(name, old, new, adv, mask, config, rollout_is_weights=torch.ones_like(old)), plain)
    weights = torch.zeros_like(old)
    weights[1] = 3.0  # only row 1 counts, three times
    row_only = _loss(name, old, new, adv, mask, config, rollout_is_weights=(weights > 0).float())
    weighted = _loss(name, old, new, adv, mask, config, rollout_is_weights=weights)
    torch.testing.assert_close(weighted, 3.0 * row_only)


def test_a_weighted_vanilla_loss_equals_the_hand_computed_weighted_token_mean(actor_config):
    old, new, adv, mask = _inputs(seed=1)
    weights = torch.rand_like(old) * 2
    loss = _loss("vanilla", old, new, adv, mask, actor_config(), rollout_is_weights=weights)
    ratio = torch.exp(new - old)
    token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    token = torch.where(adv < 0, torch.minimum(token, -adv * 3.0), token)
    torch.testing.assert_close(loss, (token * weights * mask).sum() / mask.sum())


def test_reinforce_is_without_weights_or_rejection_is_plain_reinforce(actor_config):
    old, new, adv, mask = _inputs(seed=2)
    settings = RolloutCorrectionConfig(bypass_mode=True, loss_type="reinforce")
    loss, _ = compute_policy_loss_reinforce_is(old, new, adv, mask, "token-mean", None, rollout_correction=settings)
    expected, _ = compute_policy_loss_gpg(old, new, adv, mask, "token-mean", None)
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_reinforce_is_gradient_is_the_truncated_importance_weighted_policy_gradient(level):
    old, new, adv, mask = _inputs(seed=3)
    log_prob = new.clone().requires_grad_(True)
    settings = RolloutCorrectionConfig(rollout_is=level, rollout_is_threshold=1.5, bypass_mode=True)
    loss, metrics = compute_policy_loss_reinforce_is(
        old, log_prob, adv, mask, "token-mean", None, rollout_correction=settings
    )
    loss.backward()
    log_ratio = (new - old) * mask
    ratio = torch.exp(log_ratio) if level == "token" else torch.exp(log_ratio.sum(-1, keepdim=True)).expand_as(new)
    weights = ratio.clamp(max=1.5)
    torch.testing.assert_close(log_prob.grad, -weights * adv * mask / mask.sum())  # ∇ of −w·A·log π, token-mean
    assert metrics["rollout_corr/is_weight_mean"] <= 1.5
    assert {"rollout_corr/kl_k1", "rollout_corr/is_weight_mean", "pg_clipfrac", "ppo_kl"} <= set(metrics)


def test_reinforce_is_drops_the_tokens_its_rejection_rule_rejects():
    old, new, adv, mask = _inputs(seed=4)
    settings = RolloutCorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold="0.7_1.4", bypass_mode=True)
    loss, metrics = compute_policy_loss_reinforce_is(
        old, new, adv, mask, "token-mean", None, rollout_correction=settings
    )
    kept = rejection_mask(new, old, mask, parse_rejection_rules("token_k1", "0.7_1.4"))
    assert 0 < kept.sum() < mask.sum()  # the rule rejects some tokens, not all
    torch.testing.assert_close(loss, (-adv * new * kept).sum() / mask.sum())
    torch.testing.assert_close(metrics["rollout_corr/rejected_token_fraction"], 1 - kept.sum() / mask.sum())


def test_reinforce_is_without_its_settings_refuses_and_names_the_keyword():
    old, new, adv, mask = _inputs()
    with pytest.raises(ValueError, match="rollout_correction"):
        compute_policy_loss_reinforce_is(old, new, adv, mask, "token-mean", None)
