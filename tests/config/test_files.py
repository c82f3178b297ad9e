"""Paths: `~` means the home folder in every path key, and what the run reads is checked at load."""

from pathlib import Path

import pytest

from hyflow.config import ConfigError, PPOTrainerConfig, check_config, load_config
from hyflow.config.loading import expand_home
from hyflow.data.prepare import prepare_task

GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "data.train_batch_size=4"]
GRPO += ["actor_rollout_ref.actor.ppo_mini_batch_size=2"]
MODEL, TRAIN = "actor_rollout_ref.model.path=~/model", "data.train_files=~/data/train.parquet"


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    return caught.value.problems


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    prepare_task("arith", home / "data", seed=0, train_size=10, test_size=4, num_digits=1)
    (home / "model").mkdir()
    (home / "model" / "config.json").write_text("{}")
    (home / "tools.yaml").write_text("tools: []\n")
    return home


def test_a_tilde_starts_a_path_in_the_home_folder_in_every_path_key(home):
    config = load_config(
        [
            *GRPO,
            "data.train_files=[~/data/train.parquet,~/data/train.parquet]",
            "data.val_files='~/data/test.parquet'",  # quoted: expanded by finalize, with the other path keys
            "actor_rollout_ref.model.path=~/model",
            "actor_rollout_ref.rollout.multi_turn.tool_config_path=~/tools.yaml",
            "trainer.default_local_dir=~/runs/one",
            "trainer.rollout_data_dir=~",
        ]
    )

    assert config.data.train_files == [f"{home}/data/train.parquet"] * 2
    assert config.data.val_files == f"{home}/data/test.parquet"
    assert config.actor_rollout_ref.model.path == f"{home}/model"
    assert config.critic.model.path == f"{home}/model"  # inherited after expansion
    assert config.actor_rollout_ref.rollout.multi_turn.tool_config_path == f"{home}/tools.yaml"
    assert config.trainer.default_local_dir == f"{home}/runs/one"
    assert config.trainer.rollout_data_dir == str(home)


def test_a_config_built_in_python_gets_its_tilde_paths_expanded_too(home):
    built = PPOTrainerConfig()
    built.actor_rollout_ref.model.path = "~/model"
    built.data.train_files = "~/data/train.parquet"
    built.data.train_batch_size, built.actor_rollout_ref.actor.ppo_mini_batch_size = 4, 4

    assert check_config(built).actor_rollout_ref.model.path == f"{home}/model"


def test_only_a_leading_tilde_of_a_value_or_list_item_is_the_home_folder(home):
    assert expand_home("trainer.experiment_name=run~2") == "trainer.experiment_name=run~2"
    assert expand_home("~trainer.logger") == "~trainer.logger"  # Hydra's delete, not a path
    assert expand_home("a=[~/x, ~/y]") == f"a=[{home}/x, {home}/y]"


def test_a_missing_model_folder_is_reported_under_the_model_key_not_the_tokenizer_key(home):
    (problem,) = _problems([*GRPO, "actor_rollout_ref.model.path=~/nowhere", TRAIN])

    assert problem.startswith(f"actor_rollout_ref.model.path='{home}/nowhere' is not a local folder")
    assert "tokenizer_path" not in problem


def test_a_missing_model_folder_names_the_hf_download_command_of_current_huggingface_hub(home):
    (problem,) = _problems([*GRPO, "actor_rollout_ref.model.path=~/nowhere", TRAIN])

    assert "`hf download NAME --local-dir DIR`" in problem and "huggingface-cli" not in problem


def test_a_folder_without_config_json_is_not_a_model_folder(home):
    (problem,) = _problems([*GRPO, "actor_rollout_ref.model.path=~/data", TRAIN])

    assert "has no config.json" in problem


def test_missing_data_files_are_named_each(home):
    problems = _problems(
        [*GRPO, MODEL, "data.train_files=[~/data/train.parquet,~/gone.parquet]", "data.val_files=~/x.jsonl"]
    )

    assert len(problems) == 2
    assert f"data.train_files: '{home}/gone.parquet' is not a file" in problems[0]
    assert f"data.val_files: '{home}/x.jsonl' is not a file" in problems[1]


def test_fewer_training_rows_than_one_batch_is_caught_at_load(home):
    (problem,) = _problems([*GRPO, MODEL, TRAIN, "data.train_batch_size=12"])

    assert "data.train_batch_size=12 is more than the 10 training rows of data.train_files" in problem
    assert "Fix: set data.train_batch_size to at most 10" in problem


def test_train_max_samples_counts_against_the_batch(home):
    (problem,) = _problems([*GRPO, MODEL, TRAIN, "data.train_max_samples=2"])

    assert "data.train_batch_size=4 is more than the 2 training rows" in problem


def test_a_missing_tool_config_is_named_with_its_key(home):
    (problem,) = _problems([*GRPO, "actor_rollout_ref.rollout.multi_turn.tool_config_path=~/tool.yaml"])

    assert problem.startswith("actor_rollout_ref.rollout.multi_turn.tool_config_path=")
    assert "is not a file" in problem


def test_the_file_checks_can_be_left_out_for_a_launch_line_meant_for_another_machine():
    config = load_config([*GRPO, "data.train_files=/cluster/train.parquet"], check_files=False)

    assert config.data.train_files == "/cluster/train.parquet"


def test_a_model_without_data_is_rejected_since_the_embedded_default_stands_in_for_both_or_neither(home):
    (problem,) = _problems([*GRPO, MODEL])

    assert problem.startswith("data.train_files is not set, but actor_rollout_ref.model.path is")
    assert problem.endswith("Fix: set data.train_files too, or leave out both.")


def test_a_tokenizer_folder_needs_a_saved_tokenizer_not_a_model_config(home):
    (home / "tokenizer").mkdir()
    (home / "tokenizer" / "tokenizer.json").write_text("{}")
    config = load_config([*GRPO, MODEL, TRAIN, "actor_rollout_ref.model.tokenizer_path=~/tokenizer"])
    assert config.actor_rollout_ref.model.tokenizer_path == f"{home}/tokenizer"

    (problem,) = _problems([*GRPO, MODEL, TRAIN, "actor_rollout_ref.model.tokenizer_path=~/data"])
    assert problem.startswith(f"actor_rollout_ref.model.tokenizer_path='{home}/data' is not a local folder with")
