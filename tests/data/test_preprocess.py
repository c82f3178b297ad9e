"""Preprocessing: raw GSM8K / MATH files and the synthetic tasks to schema rows, deterministic by seed."""

import json

import pytest

from hyflow.data.preprocess import arith, countdown, gsm8k
from hyflow.data.preprocess import math as math_pre
from hyflow.reward.scorers import default_compute_score

GSM8K_RECORDS = [
    {"question": f"Tom has {i} apples and buys 1,000 more.", "answer": f"{i} + 1000 = {i + 1000}\n#### {i + 1000:,}"}
    for i in range(6)
]
MATH_RECORDS = [
    {"problem": "What is $1/2 + 1/4$?", "solution": "It is $\\boxed{\\frac{3}{4}}$.", "level": "Level 1", "type": "A"},
    {"problem": "Simplify $x$.", "solution": "No boxed answer here.", "level": "Level 2", "type": "A"},
]


def test_gsm8k_rows_carry_the_number_after_hashes_as_ground_truth(tmp_path):
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in GSM8K_RECORDS[:3]))
    splits = gsm8k.make_splits(folder)
    row = splits["train"][2]
    assert row["data_source"] == "openai/gsm8k"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "1002"}
    assert row["prompt"][0]["content"].endswith('output the final answer after "####".')
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 2
    assert default_compute_score(row["data_source"], row["extra_info"]["answer"], row["reward_model"]["ground_truth"])


def test_one_raw_file_is_split_by_test_fraction_deterministically(tmp_path):
    path = tmp_path / "all.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in GSM8K_RECORDS))
    first = gsm8k.make_splits(path, seed=1, test_fraction=0.5)
    second = gsm8k.make_splits(path, seed=1, test_fraction=0.5)
    assert len(first["train"]) == len(first["test"]) == 3
    assert first == second


def test_a_raw_record_without_its_fields_is_a_clear_error(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"q": "x"}))
    (tmp_path / "test.jsonl").write_text(json.dumps(GSM8K_RECORDS[0]))
    with pytest.raises(ValueError, match="record 0 has no 'question' field"):
        gsm8k.make_splits(tmp_path)


def test_math_reads_one_json_per_problem_and_skips_unboxed_solutions(tmp_path):
    for split in ("train", "test"):
        for i, record in enumerate(MATH_RECORDS):
            (tmp_path / split / "algebra").mkdir(parents=True, exist_ok=True)
            (tmp_path / split / "algebra" / f"{i}.json").write_text(json.dumps(record))
    splits = math_pre.make_splits(tmp_path)
    assert [len(splits["train"]), len(splits["test"])] == [1, 1]
    row = splits["test"][0]
    assert row["reward_model"]["ground_truth"] == "\\frac{3}{4}" and row["extra_info"] == {"split": "test", "index": 0}
    assert default_compute_score(row["data_source"], "so \\boxed{\\frac34}", row["reward_model"]["ground_truth"]) == 1.0


def test_a_folder_without_split_files_names_what_is_missing(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps(GSM8K_RECORDS[0]))
    with pytest.raises(ValueError, match="found no test files"):
        gsm8k.make_splits(tmp_path)


def test_arith_is_deterministic_by_seed_and_its_reference_answers_score_full_marks():
    rows = arith.make_rows(20, seed=5, num_digits=3, num_operands=3, operators="+-*")
    assert rows == arith.make_rows(20, seed=5, num_digits=3, num_operands=3, operators="+-*")
    assert rows != arith.make_rows(20, seed=6, num_digits=3, num_operands=3, operators="+-*")
    for row in rows:
        assert len(row["extra_info"]["expression"].split()) == 5
        assert int(row["reward_model"]["ground_truth"]) >= 0
        score = default_compute_score("arith", row["extra_info"]["answer"], row["reward_model"]["ground_truth"])
        assert score["score"] == 1.0


def test_arith_follows_operator_precedence():
    assert arith.evaluate([2, 3, 4], ["+", "*"]) == 14
    assert arith.evaluate([10, 2, 3, 4], ["-", "*", "+"]) == 8


def test_synthetic_prompts_stay_short_for_the_tiny_tokenizer():
    from hyflow.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    rows = arith.make_rows(5, seed=0, num_digits=3) + countdown.make_rows(5, seed=0, num_numbers=4, max_number=99)
    for row in rows:
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) < 64


def test_countdown_targets_are_reachable_with_every_number_once():
    rows = countdown.make_rows(30, seed=2, num_numbers=4, max_number=20)
    assert rows == countdown.make_rows(30, seed=2, num_numbers=4, max_number=20)
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        assert truth["target"] > 0 and len(truth["numbers"]) == 4
        assert default_compute_score("countdown", row["extra_info"]["answer"], truth)["score"] == 1.0


@pytest.mark.parametrize(
    ("make", "kwargs", "key"),
    [
        (arith.make_rows, {"num_digits": 0}, "num_digits"),
        (arith.make_rows, {"operators": "+/"}, "operators"),
        (countdown.make_rows, {"num_numbers": 1}, "num_numbers"),
    ],
)
def test_bad_difficulty_settings_name_the_setting(make, kwargs, key):
    with pytest.raises(ValueError, match=key):
        make(3, seed=0, **kwargs)


def test_records_without_a_row_are_skipped_and_counted_in_a_warning(tmp_path, caplog):
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("\n".join(json.dumps(record) for record in MATH_RECORDS))
    with caplog.at_level("WARNING"):
        splits = math_pre.make_splits(tmp_path)
    assert [len(splits["train"]), len(splits["test"])] == [1, 1]
    assert caplog.text.count("skipped 1 problems without a boxed answer") == 2


def test_synthetic_train_and_test_splits_come_from_consecutive_seeds():
    splits = arith.make_splits(train_size=4, test_size=3, seed=7)
    assert splits["train"] == arith.make_rows(4, 7, "train")
    assert splits["test"] == arith.make_rows(3, 8, "test")


def test_expressions_are_written_operand_operator_operand():
    assert arith.format_expression([12, 34, 5], ["+", "*"]) == "12 + 34 * 5"


def _verl_made_table(data_source: str, extra_info: dict):
    """A one-row table with the schema verl's example preprocessors write (built here, not read from verl)."""
    import pyarrow as pa

    row = {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": "What is 1 + 1?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2"},
        "extra_info": extra_info,
    }
    return pa.Table.from_pylist([row])


@pytest.mark.parametrize("task", ["gsm8k", "math"])
def test_a_hyflow_made_file_concatenates_with_a_verl_made_one(tmp_path, task):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hyflow.data.preprocess import gsm8k as gsm8k_pre
    from hyflow.data.preprocess import math as math_pre

    if task == "gsm8k":
        rows = [gsm8k_pre.to_row({"question": "Q?", "answer": "so 2\n#### 2"}, "train", 0)]
        verl = _verl_made_table("openai/gsm8k", {"split": "train", "index": 7, "answer": "#### 2", "question": "Q?"})
    else:
        rows = [math_pre.to_row({"problem": "P?", "solution": "so \\boxed{2}"}, "train", 0)]
        verl = _verl_made_table("DigitalLearningGmbH/MATH-lighteval", {"split": "train", "index": 7})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "hyflow.parquet")

    both = pa.concat_tables([verl, pq.read_table(tmp_path / "hyflow.parquet")])

    assert both.num_rows == 2 and both.schema.field("extra_info").type == verl.schema.field("extra_info").type
