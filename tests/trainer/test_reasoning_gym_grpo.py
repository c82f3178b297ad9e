"""GRPO end to end on a reasoning-gym task: prepare-data's parquet, the built-in `reasoning_gym/<task>` scorer."""

import pytest

from hyflow.data.prepare import prepare_task
from hyflow.models.tiny import build_tiny_model
from hyflow.trainer.ppo_trainer import PPOTrainer
from tests.trainer.ppo_testkit import read_metrics, tiny_config

pytestmark = pytest.mark.usefixtures("in_tmp_path")


@pytest.mark.timeout(120)
def test_grpo_trains_two_steps_on_a_reasoning_gym_task_scored_by_the_task_itself(tmp_path):
    model = build_tiny_model(tmp_path / "model", arch="qwen2", hidden_size=32, num_layers=2, intermediate_size=64)
    data = prepare_task("reasoning_gym", tmp_path / "data", tasks="basic_arithmetic,chain_sum", train_size=4,
                        test_size=2, system_prompt="none", config={"max_terms": 3, "max_digits": 2})  # fmt: skip
    assets = {"model": model, "train": data["train"], "val": data["test"]}
    trainer = PPOTrainer(tiny_config(assets, tmp_path / "out", "data.max_prompt_length=96"))  # no custom reward
    trainer.init_workers()
    try:
        trainer.fit()
    finally:
        trainer.close()

    steps = read_metrics(trainer.tracking.log_dir)
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        metrics = step["data"]
        assert 0.0 <= metrics["critic/score/min"] <= metrics["critic/score/max"] <= 1.0
        assert metrics["reward/error_count"] == 0
