"""`hyflow prepare-data`: writes train/test parquet that RLHFDataset reads back."""

import json

import pyarrow.parquet as pq

from hyflow.cli import main as hyflow_main
from hyflow.config.data import DataConfig
from hyflow.data.dataset import RLHFDataset
from hyflow.data.prepare import prepare_task


def test_prepare_data_command_writes_synthetic_splits_the_dataset_can_read(tmp_path, tokenizer):
    out = tmp_path / "arith"
    code = hyflow_main(["prepare-data", "arith", "--output", str(out), "--train-size", "8", "--test-size", "3"])
    assert code == 0
    assert pq.read_table(out / "train.parquet").num_rows == 8
    assert pq.read_table(out / "test.parquet").num_rows == 3
    dataset = RLHFDataset(str(out / "train.parquet"), tokenizer, DataConfig(max_prompt_length=64))
    assert len(dataset) == 8


def test_gsm8k_round_trips_through_parquet(tmp_path, tokenizer):
    raw = tmp_path / "raw"
    raw.mkdir()
    record = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}
    for split in ("train", "test"):
        (raw / f"{split}.jsonl").write_text(json.dumps(record) + "\n" + json.dumps(record))
    written = prepare_task("gsm8k", tmp_path / "out", raw)
    dataset = RLHFDataset(written["test"], tokenizer, DataConfig(max_prompt_length=128))
    assert dataset.rows[0]["reward_model"]["ground_truth"] == "4"
    assert dataset.rows[1]["extra_info"]["question"] == "What is 2 + 2?"


def test_countdown_ground_truth_survives_parquet(tmp_path):
    written = prepare_task("countdown", tmp_path, train_size=4, test_size=2, seed=3)
    truth = pq.read_table(written["train"]).to_pylist()[0]["reward_model"]["ground_truth"]
    assert set(truth) == {"target", "numbers"} and len(truth["numbers"]) == 3


def test_missing_input_for_a_raw_dataset_is_reported_with_exit_code_2(tmp_path, caplog):
    assert hyflow_main(["prepare-data", "gsm8k", "--output", str(tmp_path)]) == 2
    assert "--input is required" in caplog.text


def test_prepare_data_command_passes_each_synthetic_task_its_own_flags(tmp_path):
    sizes = ["--train-size", "2", "--test-size", "1", "--output"]
    assert hyflow_main(["prepare-data", "countdown", *sizes, str(tmp_path / "c"), "--num-numbers", "4"]) == 0
    truth = pq.read_table(tmp_path / "c" / "train.parquet").to_pylist()[0]["reward_model"]["ground_truth"]
    assert len(truth["numbers"]) == 4
    assert hyflow_main(["prepare-data", "arith", *sizes, str(tmp_path / "a"), "--num-operands", "3"]) == 0
    expression = pq.read_table(tmp_path / "a" / "test.parquet").to_pylist()[0]["extra_info"]["expression"]
    assert len(expression.split()) == 5  # three operands, two operators


def test_missing_gsm8k_or_math_data_names_the_hf_download_command_that_fetches_it(tmp_path, caplog):
    for task, dataset in (("gsm8k", "openai/gsm8k"), ("math", "EleutherAI/hendrycks_math")):
        caplog.clear()
        assert hyflow_main(["prepare-data", task, "--input", str(tmp_path / "nowhere"), "--output", str(tmp_path)]) == 2
        error = caplog.text
        assert f"--input '{tmp_path / 'nowhere'}' does not exist" in error
        assert f"`hf download {dataset} --repo-type dataset" in error and "huggingface-cli" not in error
