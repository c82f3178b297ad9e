"""Placement: which roles a config needs (what it cannot run is a config check, tests/config/test_checks.py)."""

from __future__ import annotations

import pytest

from hyflow.config import load_config
from hyflow.trainer.placement import ACTOR_ROLLOUT, CRITIC, REWARD_MODEL, role_classes

BASE = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=2"]


def roles_of(*overrides: str) -> dict:
    return role_classes(load_config([*BASE, *overrides]))


def test_grpo_without_kl_needs_only_the_actor_and_rollout_without_a_reference_policy():
    roles = roles_of("algorithm.adv_estimator=grpo")

    assert list(roles) == [ACTOR_ROLLOUT]
    assert roles[ACTOR_ROLLOUT].kwargs == {"actor": True, "rollout": True, "ref": False}


@pytest.mark.parametrize("kl", ["actor_rollout_ref.actor.use_kl_loss=True", "algorithm.use_kl_in_reward=True"])
def test_a_kl_term_adds_the_reference_policy_to_the_actor_process(kl):
    assert roles_of("algorithm.adv_estimator=grpo", kl)[ACTOR_ROLLOUT].kwargs["ref"] is True


def test_gae_adds_a_critic_and_an_enabled_reward_model_gets_its_own_role_in_the_same_processes(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model folder, as far as the config checks look
    roles = roles_of("algorithm.adv_estimator=gae", "reward_model.enable=True", f"reward_model.model.path={tmp_path}")

    assert list(roles) == [ACTOR_ROLLOUT, CRITIC, REWARD_MODEL]
    assert roles[CRITIC].kwargs == {"rollout_n": 2}
