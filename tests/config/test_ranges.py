"""Out-of-range numbers are caught at load, each with its key, value, rule and default, all in one report."""

import pytest

from hyflow.config import ConfigError, load_config
from hyflow.config.convert import all_keys
from hyflow.config.ranges import RANGES, Range


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    return caught.value.problems


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor_rollout_ref.actor.optim.lr=0", "actor_rollout_ref.actor.optim.lr=0.0 must be positive (> 0)"),
        ("actor_rollout_ref.actor.optim.lr=-1e-6", "actor_rollout_ref.actor.optim.lr=-1e-06 must be positive"),
        ("critic.optim.lr=-1", "critic.optim.lr=-1.0 must be positive"),
        (
            "actor_rollout_ref.actor.optim.betas=[0.9,1.0]",
            "actor_rollout_ref.actor.optim.betas[1]=1.0 must be in [0, 1)",
        ),
        ("actor_rollout_ref.actor.optim.weight_decay=-0.1", "weight_decay=-0.1 must be 0 or more"),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=1.5", "lr_warmup_steps_ratio=1.5 must be in [0, 1]"),
        ("algorithm.gamma=1.01", "algorithm.gamma=1.01 must be in [0, 1]"),
        ("algorithm.lam=-0.5", "algorithm.lam=-0.5 must be in [0, 1]"),
        ("algorithm.kl_ctrl.kl_coef=-0.001", "algorithm.kl_ctrl.kl_coef=-0.001 must be 0 or more"),
        ("actor_rollout_ref.actor.grad_clip=0", "actor_rollout_ref.actor.grad_clip=0.0 must be positive"),
        ("actor_rollout_ref.actor.kl_loss_coef=-1", "kl_loss_coef=-1.0 must be 0 or more"),
        ("actor_rollout_ref.actor.router_aux_loss_coef=-0.1", "router_aux_loss_coef=-0.1 must be 0 or more"),
        ("actor_rollout_ref.actor.moe_load_balance_metrics_interval=-1", "metrics_interval=-1 must be 0 or more"),
        ("actor_rollout_ref.rollout.top_k=0", "actor_rollout_ref.rollout.top_k=0 must be positive (> 0) or -1"),
        ("reward_model.timeout=0", "reward_model.timeout=0.0 must be positive"),
        ("trainer.test_freq=-2", "trainer.test_freq=-2 must be positive (> 0) or -1"),
        ("actor_rollout_ref.actor.optim.lr=nan", "actor_rollout_ref.actor.optim.lr=nan must be positive"),
    ],
)
def test_a_number_outside_its_range_is_rejected_with_the_rule_and_the_default(override, expected):
    problems = _problems([override])

    assert any(expected in p for p in problems), problems
    assert all("Fix: set" in p for p in problems)


def test_every_out_of_range_number_is_reported_at_once():
    problems = _problems(["actor_rollout_ref.actor.optim.lr=0", "critic.optim.lr=-1", "algorithm.gamma=2"])

    assert len(problems) == 3
    assert "(default: 1e-06)" in problems[0] and "(default: 1e-05)" in problems[1]


def test_the_documented_off_values_are_in_range():
    config = load_config(["trainer.save_freq=-1", "data.train_max_samples=-1", "actor_rollout_ref.rollout.top_k=-1"])

    assert config.trainer.save_freq == -1


def test_every_range_names_a_key_of_the_schema():
    keys = set(all_keys())

    assert [key for key in RANGES if key.partition("[")[0] not in keys] == []


def test_a_range_reads_as_words():
    assert Range(low=0, high=1, low_open=True).words() == "in (0, 1]"
    assert Range(low=0, low_open=True, also=(-1,)).words() == "positive (> 0) or -1"
