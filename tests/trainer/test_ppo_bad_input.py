"""Bad input stops the trainer with one clear message before any training, or is handled as the reward manager's
rules say: a malformed dataset row, a reward function that raises, a config that cannot work."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hyflow.config import ConfigError
from hyflow.data.dataset import read_rows
from hyflow.trainer.ppo_trainer import PPOTrainer
from tests.trainer.ppo_testkit import build_assets, read_metrics, tiny_config

RAISING_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    raise RuntimeError("the grader crashed")
"""


pytestmark = pytest.mark.usefixtures("in_tmp_path")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    found = build_assets(root)
    (root / "raising_reward.py").write_text(RAISING_REWARD)
    found["raising_reward"] = str(root / "raising_reward.py")
    return found


def test_a_dataset_row_without_a_ground_truth_stops_before_any_worker_starts(assets, tmp_path):
    rows = read_rows(assets["train"])
    rows[3]["reward_model"] = None
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), bad)
    config = tiny_config(assets, tmp_path, f"data.train_files={bad}")

    with pytest.raises(ValueError, match=r"bad\.parquet', row 3, column 'reward_model'"):
        PPOTrainer(config)


def test_a_custom_reward_function_that_is_missing_stops_before_any_worker_starts(assets, tmp_path):
    config = tiny_config(
        assets, tmp_path, f"custom_reward_function.path={assets['raising_reward']}", "custom_reward_function.name=nope"
    )

    with pytest.raises(ValueError, match=r"custom_reward_function\.name='nope' is not a function"):
        PPOTrainer(config)


@pytest.mark.timeout(120)
def test_a_reward_function_that_raises_stops_the_first_step_naming_the_function_and_row(assets, tmp_path):
    config = tiny_config(assets, tmp_path, f"custom_reward_function.path={assets['raising_reward']}")
    trainer = PPOTrainer(config)
    trainer.init_workers()
    try:
        with pytest.raises(ValueError, match=r"row 0 \(data_source='arith'.*raised RuntimeError: the grader crashed"):
            trainer.fit()
    finally:
        trainer.close()
    assert trainer.global_step == 1 and not (tmp_path / "ckpt").exists()  # no update, no checkpoint


def _prime_with_a_raising_reward(assets, tmp_path, *overrides):
    return tiny_config(
        assets,
        tmp_path,
        f"custom_reward_function.path={assets['raising_reward']}",
        "reward_model.reward_manager=prime",
        "reward_model.num_processes=1",
        "trainer.total_training_steps=1",
        *overrides,
    )


@pytest.mark.timeout(180)
def test_the_prime_manager_stops_the_run_when_the_reward_fails_on_every_row(assets, tmp_path):
    trainer = PPOTrainer(_prime_with_a_raising_reward(assets, tmp_path))
    trainer.init_workers()
    try:
        with pytest.raises(ValueError, match=r"failed on 8 of 8 rows of a batch \(\{'error': 8"):
            trainer.fit()
    finally:
        trainer.close()


@pytest.mark.timeout(180)
def test_below_the_stop_threshold_prime_scores_failures_zero_and_counts_them_in_the_metrics(assets, tmp_path):
    config = _prime_with_a_raising_reward(assets, tmp_path, "reward_model.stop_at_failed_fraction=2")
    trainer = PPOTrainer(config)
    trainer.init_workers()
    try:
        trainer.fit()
    finally:
        trainer.close()
    (step,) = read_metrics(trainer.tracking.log_dir)
    assert step["data"]["critic/score/max"] == 0.0 and "actor/pg_loss" in step["data"]
    assert step["data"]["reward/error_count"] == 8.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor_rollout_ref.rollout.n=1"], "needs actor_rollout_ref.rollout.n > 1"),
        (["algorithm.adv_estimator=gae", "critic.enable=False"], "'gae' needs a critic"),
        (["data.train_batch_size=3"], "must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size"),
    ],
)
def test_a_config_that_cannot_work_is_rejected_with_the_rule_and_the_fix(assets, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(assets, tmp_path, *overrides)


def test_a_training_batch_larger_than_the_dataset_is_rejected_when_the_config_loads(assets, tmp_path):
    overrides = ["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32"]

    with pytest.raises(ValueError, match=r"data.train_batch_size=32 is more than the 16 training rows"):
        tiny_config(assets, tmp_path, *overrides)


def test_a_training_batch_larger_than_what_the_length_filter_leaves_is_rejected_before_any_worker_starts(
    assets, tmp_path
):
    overrides = ["data.max_prompt_length=20", "data.filter_overlong_prompts=True"]
    config = tiny_config(assets, tmp_path, *overrides)

    with pytest.raises(ValueError, match=r"is larger than the training set|no rows left"):
        PPOTrainer(config)


def test_an_unwritable_checkpoint_folder_stops_the_trainer_before_any_worker_starts(assets, tmp_path):
    (tmp_path / "a_file").write_text("")
    config = tiny_config(assets, tmp_path, f"trainer.default_local_dir={tmp_path / 'a_file' / 'ckpt'}")
    with pytest.raises(ValueError, match=r"trainer\.default_local_dir=.* is not writable"):
        PPOTrainer(config)
