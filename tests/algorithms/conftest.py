"""Fixtures for the algorithm tests: an actor config stand-in with verl's attribute names."""

from types import SimpleNamespace

import pytest


def make_actor_config(**overrides):
    """Any object with the actor's attributes works as a policy-loss config; this is the smallest one."""
    policy_loss = SimpleNamespace(
        loss_mode="vanilla",
        clip_cov_ratio=0.0002,
        clip_cov_lb=1.0,
        clip_cov_ub=5.0,
        kl_cov_ratio=0.0002,
        ppo_kl_coef=0.1,
        dro_beta=0.05,  # the default is None, which loss_mode=dro refuses
    )
    for key in list(overrides):
        if hasattr(policy_loss, key):
            setattr(policy_loss, key, overrides.pop(key))
    fields = dict(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0, policy_loss=policy_loss)
    fields.update(overrides)
    return SimpleNamespace(**fields)


@pytest.fixture
def actor_config():
    return make_actor_config
