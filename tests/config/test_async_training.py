"""`trainer.placement` and `async_training.*`: the modes load, and combinations that cannot run are problems
naming the keys and the fix."""

import pytest

from hyflow.config import ConfigError, load_config
from hyflow.config.async_rules import chunk_prompts_of

SPLIT = ["trainer.placement=split", "trainer.device=cpu"]


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    return caught.value.problems


def test_the_default_is_colocated_and_synchronous_on_the_local_backend():
    config = load_config(["trainer.device=cpu"])
    assert (config.trainer.placement, config.async_training.mode, config.trainer.backend) == (
        "colocated",
        "sync",
        "local",
    )


def test_split_placement_chooses_the_ray_backend_and_loads_the_rollout_pool_size():
    config = load_config([*SPLIT, "trainer.rollout_n_gpus_per_node=2", "async_training.mode=fully_async"])
    assert config.trainer.backend == "ray" and config.trainer.rollout_n_gpus_per_node == 2


def test_an_asynchronous_mode_without_a_rollout_pool_is_a_problem_naming_the_fix():
    problems = _problems(["async_training.mode=one_step_off"])
    assert any("trainer.placement='colocated'" in p and "trainer.placement=split" in p for p in problems)


def test_split_placement_on_the_local_backend_is_a_problem():
    problems = _problems([*SPLIT, "trainer.backend=local"])
    assert any("trainer.backend='local'" in p and "trainer.backend=ray" in p for p in problems)


def test_a_negative_staleness_bound_is_a_range_problem():
    problems = _problems([*SPLIT, "async_training.mode=fully_async", "async_training.max_staleness=-1"])
    assert any(p.startswith("async_training.max_staleness=-1 must be 0 or more") for p in problems)


def test_chunks_that_do_not_divide_the_training_batch_are_a_problem():
    overrides = [*SPLIT, "async_training.mode=fully_async", "async_training.chunk_prompts=3", "data.train_batch_size=8"]
    assert any("async_training.chunk_prompts=3 must divide data.train_batch_size=8" in p for p in _problems(overrides))


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("algorithm.adv_estimator=remax", "algorithm.adv_estimator='remax'"),
        ("algorithm.filter_groups.enable=True", "algorithm.filter_groups.enable=True"),
    ],
)
def test_features_that_generate_synchronously_are_refused_in_asynchronous_modes(override, named):
    problems = _problems([*SPLIT, "async_training.mode=one_step_off", override])
    assert any(named in p and "async_training.mode=sync" in p for p in problems)


@pytest.mark.parametrize("mode", ["one_step_off", "fully_async"])
def test_agent_loops_load_in_the_asynchronous_modes(mode):
    agent = ["actor_rollout_ref.rollout.multi_turn.enable=True", "data.return_raw_chat=True"]
    config = load_config([*SPLIT, f"async_training.mode={mode}", *agent])
    assert chunk_prompts_of(config) == 1 and config.actor_rollout_ref.rollout.multi_turn.enable


@pytest.mark.parametrize(
    ("batch", "n", "rollout_gpus", "expected"),
    [
        (64, 8, 1, 32),  # 32 x 8 = 256 rows: the smallest divisor of 64 that fills the engine
        (64, 16, 1, 16),
        (64, 8, 2, 64),  # 512 rows for two engines: the whole batch
        (48, 8, 1, 48),  # no divisor of 48 below it reaches 256 rows but 48 itself (384)
        (512, 16, 2, 32),  # 32 x 16 = 512 = 256 rows on each of two engines
        (8, 2, 1, 8),  # a tiny batch: one chunk a batch
    ],
)
def test_the_auto_chunk_is_the_fewest_prompts_that_give_every_rollout_engine_256_rows(batch, n, rollout_gpus, expected):
    config = load_config(
        [
            *SPLIT,
            "async_training.mode=fully_async",
            f"data.train_batch_size={batch}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
            f"actor_rollout_ref.rollout.n={n}",
            f"trainer.rollout_n_gpus_per_node={rollout_gpus}",
        ]
    )
    assert config.async_training.chunk_prompts == 0 and chunk_prompts_of(config) == expected


def test_a_chunk_size_set_by_hand_is_kept():
    overrides = [*SPLIT, "async_training.mode=fully_async", "async_training.chunk_prompts=4", "data.train_batch_size=8"]
    assert chunk_prompts_of(load_config([*overrides, "actor_rollout_ref.actor.ppo_mini_batch_size=8"])) == 4


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["async_training.mode=fully_async", "async_training.chunk_prompts=2"], "async_training.chunk_prompts=2"),
        (["async_training.mode=fully_async", "actor_rollout_ref.rollout.name=hf"], "rollout.name='hf'"),
    ],
)
def test_agent_loops_in_an_asynchronous_mode_refuse_what_they_cannot_schedule(overrides, named):
    problems = _problems(
        [*SPLIT, "actor_rollout_ref.rollout.multi_turn.enable=True", "data.return_raw_chat=True", *overrides]
    )
    assert any(named in p and "Fix:" in p for p in problems)


def test_a_rollout_pool_sharing_the_training_devices_must_have_the_training_pools_size():
    config = load_config([*SPLIT, "trainer.rollout_shares_devices=True"])
    assert config.trainer.rollout_shares_devices
    problems = _problems([*SPLIT, "trainer.rollout_shares_devices=True", "trainer.rollout_n_gpus_per_node=2"])
    assert any("trainer.rollout_shares_devices=True" in p and "rollout_n_gpus_per_node" in p for p in problems)
