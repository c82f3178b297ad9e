"""RLHFDataset: chat template, left padding, bad rows, overlong prompts, truncation modes, max samples."""

import json

import pytest

from hyflow.config.data import DataConfig
from hyflow.data.collate import collate_fn
from hyflow.data.dataset import RLHFDataset, truncate_ids
from hyflow.data.preprocess import arith
from hyflow.protocol import DataProto


def _row(content="Compute 1 + 2.", truth="3", **extra):
    return {
        "data_source": "arith",
        "prompt": [{"role": "user", "content": content}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": "train", "index": 7},
        **extra,
    }


def test_items_are_left_padded_chat_prompts_with_the_schema_fields(tokenizer, write_rows):
    path = write_rows(arith.make_rows(4, seed=0))
    config = DataConfig(max_prompt_length=64, return_raw_chat=True)
    dataset = RLHFDataset(path, tokenizer, config)
    item = dataset[0]
    assert item["input_ids"].shape == (64,)
    num_real = int(item["attention_mask"].sum())
    assert item["input_ids"][: 64 - num_real].eq(tokenizer.pad_token_id).all()
    assert item["position_ids"][-num_real:].tolist() == list(range(num_real))
    text = tokenizer.decode(item["input_ids"][-num_real:])
    assert text.startswith("<|im_start|>user\nCompute ") and text.endswith("<|im_start|>assistant\n")
    assert item["raw_prompt"][0]["role"] == "user"
    assert item["raw_prompt_ids"] == item["input_ids"][-num_real:].tolist()
    assert item["data_source"] == "arith" and item["agent_name"] is None
    assert item["index"] == 0 and item["tools_kwargs"] == {}


def test_collated_batch_becomes_a_data_proto(tokenizer, write_rows):
    path = write_rows(arith.make_rows(3, seed=0))
    dataset = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=64))
    data = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(3)]))
    assert data.batch["input_ids"].shape == (3, 64)
    assert data.non_tensor_batch["reward_model"][1]["style"] == "rule"
    assert isinstance(data.non_tensor_batch["raw_prompt_ids"][0], list)
    assert "raw_prompt" not in data.non_tensor_batch


def test_several_files_are_read_in_order_and_max_samples_keeps_the_first_rows(tokenizer, write_rows):
    first = write_rows([_row("a", "1"), _row("b", "2")], "first.parquet")
    second = write_rows([_row("c", "3")], "second.parquet")
    config = DataConfig(max_prompt_length=32)
    assert [r["reward_model"]["ground_truth"] for r in RLHFDataset([first, second], tokenizer, config).rows] == [
        "1",
        "2",
        "3",
    ]
    assert len(RLHFDataset([first, second], tokenizer, config, max_samples=2)) == 2


@pytest.mark.parametrize(
    ("row", "column", "problem"),
    [
        ({k: v for k, v in _row().items() if k != "data_source"}, "data_source", "missing"),
        (_row() | {"prompt": "just a string"}, "prompt", "list of chat messages"),
        (_row() | {"prompt": [{"role": "user", "content": 5}]}, "prompt", "int content"),
        (_row() | {"prompt": [{"role": "robot", "content": "x"}]}, "prompt", "role 'robot'"),
        (_row() | {"reward_model": {"style": "rule"}}, "reward_model", "ground_truth"),
        (_row(truth=None), "reward_model", "ground_truth is None, and the scorer of data source 'arith' needs one"),
    ],
)
def test_bad_rows_fail_at_load_naming_file_row_and_column(tokenizer, tmp_path, row, column, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_row()) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl") as info:
        RLHFDataset(str(path), tokenizer, DataConfig(max_prompt_length=64))
    message = str(info.value)
    assert "row 1" in message and f"column {column!r}" in message and problem in message


def test_an_empty_or_missing_file_is_a_clear_error(tokenizer, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty"):
        RLHFDataset(str(tmp_path / "empty.jsonl"), tokenizer, DataConfig())
    with pytest.raises(ValueError, match="does not exist"):
        RLHFDataset(str(tmp_path / "nope.parquet"), tokenizer, DataConfig())


def test_overlong_prompts_are_dropped_when_filtering_and_the_count_is_logged(tokenizer, write_rows, caplog):
    path = write_rows([_row("short"), _row("long " * 40), _row("tiny")])
    config = DataConfig(max_prompt_length=24, filter_overlong_prompts=True)
    with caplog.at_level("WARNING"):
        dataset = RLHFDataset(path, tokenizer, config)
    assert len(dataset) == 2
    assert "dropped 1 of 3 prompts" in caplog.text


def test_prompts_without_text_are_named_in_one_warning_at_load(tokenizer, write_rows, caplog):
    path = write_rows([_row("Compute 1 + 2."), _row(""), _row("   "), _row("Compute 2 + 2.")])
    with caplog.at_level("WARNING", logger="hyflow.data.dataset"):
        dataset = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=64))
    assert len(dataset) == 4
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1
    assert "data.parquet" in warnings[0] and "2 of 4 prompts have no text (rows 1, 2)" in warnings[0]


def test_overlong_prompt_with_truncation_error_fails_at_load(tokenizer, write_rows):
    path = write_rows([_row("short"), _row("long " * 40)])
    with pytest.raises(ValueError, match=r"row 1, column 'prompt'.*max_prompt_length=24"):
        RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=24, truncation="error"))


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes_cut_prompts_to_max_prompt_length(tokenizer, write_rows, mode):
    path = write_rows([_row("long " * 40)])
    dataset = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=24, truncation=mode))
    full = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=4096)).prompt_ids[0]
    item = dataset[0]
    assert int(item["attention_mask"].sum()) == 24
    assert item["input_ids"].tolist() == truncate_ids(full, 24, mode)


def test_truncate_ids_keeps_the_end_the_start_or_both_ends():
    ids = list(range(10))
    assert truncate_ids(ids, 4, "left") == [6, 7, 8, 9]
    assert truncate_ids(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate_ids(ids, 5, "middle") == [0, 1, 7, 8, 9]
    assert truncate_ids(ids, 20, "left") == ids


def test_tools_of_a_row_are_rendered_by_the_chat_template(tokenizer, write_rows):
    tool = {"type": "function", "function": {"name": "calculator", "description": "adds", "parameters": {}}}
    path = write_rows([_row("Compute 1 + 2.", tools=json.dumps([tool]))])
    dataset = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=512))
    assert "calculator" in tokenizer.decode(dataset.prompt_ids[0])


def test_apply_chat_template_kwargs_reach_the_template(tokenizer, write_rows):
    path = write_rows([_row("hi")])
    plain = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=64))
    extended = RLHFDataset(
        path, tokenizer, DataConfig(max_prompt_length=64, apply_chat_template_kwargs={"add_generation_prompt": False})
    )
    assert len(extended.prompt_ids[0]) < len(plain.prompt_ids[0])


def test_tools_kwargs_from_parquet_lose_the_none_entries_of_tools_a_row_does_not_use(tokenizer, write_rows):
    first = _row() | {"extra_info": {"index": 0, "tools_kwargs": {"calc": {"create_kwargs": {"x": 1}}}}}
    second = _row() | {"extra_info": {"index": 1, "tools_kwargs": {"search": {"create_kwargs": {"k": 2}}}}}
    dataset = RLHFDataset(write_rows([first, second]), tokenizer, DataConfig(max_prompt_length=64))
    assert dataset.rows[0]["extra_info"]["tools_kwargs"]["search"] is None  # what parquet gives back
    assert dataset[0]["tools_kwargs"] == {"calc": {"create_kwargs": {"x": 1}}}
    assert dataset[1]["tools_kwargs"] == {"search": {"create_kwargs": {"k": 2}}}


def test_a_prompt_that_tokenizes_to_nothing_fails_at_load_naming_the_tokenizer(tokenizer, write_rows, monkeypatch):
    path = write_rows([_row()])
    monkeypatch.setattr(tokenizer, "chat_template", "{% for m in messages %}{% endfor %}")  # renders nothing
    with pytest.raises(ValueError, match=r"row 0, column 'prompt': the prompt tokenizes to no tokens"):
        RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=64))


def test_a_row_without_ground_truth_loads_when_its_scorer_needs_none_or_its_style_is_model(tokenizer, tmp_path):
    from hyflow.reward.scorers import register_scorer

    @register_scorer("tests/no-answer-needed", needs_ground_truth=False)
    def brevity(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0 / (1 + len(solution_str))

    rows = [_row(truth=None, data_source="tests/no-answer-needed"), _row(truth=None) | {"reward_model": {
        "style": "model", "ground_truth": None}}]  # fmt: skip
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert len(RLHFDataset(str(path), tokenizer, DataConfig(max_prompt_length=64))) == 2
