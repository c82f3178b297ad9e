"""`hyflow prepare-data reasoning_gym`: reasoning-gym entries as verl-schema parquet that RLHFDataset reads back."""

import json
import sys

import pyarrow.parquet as pq
import pytest

from hyflow.cli import main as hyflow_main
from hyflow.config.data import DataConfig
from hyflow.data.dataset import RLHFDataset
from hyflow.data.prepare import prepare_task


def test_prepare_data_reasoning_gym_writes_rows_the_dataset_loads_with_the_entry_intact(tmp_path, tokenizer):
    out = tmp_path / "rg"
    argv = ["prepare-data", "reasoning_gym", "--task", "basic_arithmetic,chain_sum", "--size", "3", "--test-size", "2",
            "--seed", "5", "--system-prompt", "none", "--output", str(out)]  # fmt: skip
    assert hyflow_main(argv) == 0

    dataset = RLHFDataset(str(out / "train.parquet"), tokenizer, DataConfig(max_prompt_length=256))
    assert len(dataset) == 6 and pq.read_table(out / "test.parquet").num_rows == 4
    assert {row["data_source"] for row in dataset.rows} == {"reasoning_gym/basic_arithmetic", "reasoning_gym/chain_sum"}
    row = dataset.rows[0]
    entry = json.loads(row["extra_info"]["entry"])
    assert row["prompt"] == [{"role": "user", "content": entry["question"]}]
    assert row["reward_model"]["ground_truth"] == entry["answer"]
    assert entry["metadata"]["source_dataset"] == row["data_source"].split("/")[1]
    assert isinstance(entry["metadata"]["difficulty"], dict)  # nested metadata survives parquet as JSON text


def test_the_task_config_sets_the_difficulty_and_the_default_system_prompt_asks_for_the_answer_tag(tmp_path):
    written = prepare_task("reasoning_gym", tmp_path, tasks="basic_arithmetic", train_size=4, test_size=1,
                           config='{"min_digits": 3, "max_digits": 3, "min_terms": 2, "max_terms": 2}')  # fmt: skip
    rows = pq.read_table(written["train"]).to_pylist()
    assert rows[0]["prompt"][0]["role"] == "system" and "<answer>" in rows[0]["prompt"][0]["content"]
    for row in rows:
        metadata = json.loads(row["extra_info"]["entry"])["metadata"]
        assert metadata["num_digits"] == 3 and metadata["num_terms"] == 2


def test_a_config_keyed_by_task_names_gives_each_task_its_own_settings(tmp_path):
    config = {"basic_arithmetic": {"min_terms": 2, "max_terms": 2}, "chain_sum": {"min_terms": 4, "max_terms": 4}}
    written = prepare_task("reasoning_gym", tmp_path, tasks="basic_arithmetic,chain_sum", train_size=2, test_size=1,
                           config=config)  # fmt: skip
    terms = {}
    for row in pq.read_table(written["train"]).to_pylist():
        terms[row["extra_info"]["task"]] = json.loads(row["extra_info"]["entry"])["metadata"]["num_terms"]
    assert terms == {"basic_arithmetic": 2, "chain_sum": 4}


def test_a_task_reasoning_gym_lacks_is_an_error_naming_close_matches(tmp_path):
    with pytest.raises(ValueError, match=r"task='basic_arithmetc' is not a reasoning-gym task; did you mean \['basic_"):
        prepare_task("reasoning_gym", tmp_path, tasks="basic_arithmetc")


def test_the_command_reports_an_unknown_task_or_a_bad_config_with_exit_code_2(tmp_path, caplog):
    unknown = ["prepare-data", "reasoning_gym", "--task", "chain_sun", "--output", str(tmp_path)]
    assert hyflow_main(unknown) == 2
    assert "did you mean ['chain_sum'" in caplog.text
    refused = ["prepare-data", "reasoning_gym", "--task", "chain_sum", "--config", '{"no_such": 1}', "--output",
               str(tmp_path)]  # fmt: skip
    assert hyflow_main(refused) == 2
    assert "reasoning_gym/chain_sum: config {'no_such': 1} was refused by the task" in caplog.text


def test_without_reasoning_gym_installed_the_command_says_how_to_install_it(tmp_path, caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError

    assert hyflow_main(["prepare-data", "reasoning_gym", "--task", "chain_sum", "--output", str(tmp_path)]) == 2
    assert "reasoning-gym is not installed; install it with `pip install 'hyflow[envs]'`" in caplog.text
