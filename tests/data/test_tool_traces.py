"""Synthetic calculator traces: deterministic rows, right products, and SFT tokens equal to what the agent loop
builds when the model writes the same turns."""

from __future__ import annotations

import json

from hyflow.agent.chat import MessageDelta, encode_prompt, encode_text
from hyflow.agent.parsers import ToolParser
from hyflow.agent.tools.calculator import calculate
from hyflow.data.dataset import read_rows
from hyflow.data.preprocess.tool_traces import make_rows, write_splits
from hyflow.data.sft_dataset import tokenize_conversation
from hyflow.models.tiny import build_tiny_tokenizer


def test_rows_are_deterministic_and_their_ground_truth_is_what_the_calculator_returns():
    rows = make_rows(5, seed=3)

    assert rows == make_rows(5, seed=3) and rows != make_rows(5, seed=4)
    for row in rows:
        expression = row["extra_info"]["expression"]
        assert row["reward_model"]["ground_truth"] == str(calculate(expression))
        assert row["messages"][2] == {"role": "tool", "content": row["reward_model"]["ground_truth"]}
        assert row["agent_name"] == "tool_agent" and json.loads(row["tools"])[0]["function"]["name"] == "calculator"


def test_the_parquet_splits_read_back_with_the_trace_and_the_prompt(tmp_path):
    files = write_splits(tmp_path, train_size=4, test_size=2, seed=0)

    train, test = read_rows(files["train"]), read_rows(files["test"])
    assert len(train) == 4 and len(test) == 2
    assert [m["role"] for m in train[0]["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert train[0]["prompt"][0]["content"] == train[0]["messages"][0]["content"]
    assert train[0]["messages"][1]["tool_calls"][0]["function"]["name"] == "calculator"


def test_sft_tokens_of_a_trace_equal_the_agent_loops_tokens_and_train_only_the_models_turns():
    tokenizer = build_tiny_tokenizer()
    row = make_rows(1, seed=0)[0]
    messages, tools = row["messages"], json.loads(row["tools"])
    sft_ids, sft_mask = tokenize_conversation(tokenizer, messages, tools)

    # What ToolAgentLoop builds when the model writes the trace's two assistant turns (each ends with eos).
    call = json.loads(messages[1]["tool_calls"][0]["function"]["arguments"])
    call_text = "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": call}) + "\n</tool_call>"
    answer_text = messages[3]["content"]
    eos = [tokenizer.eos_token_id]
    prompt = encode_prompt(tokenizer, messages[:1], tools)
    first_turn = encode_text(tokenizer, call_text) + eos
    tool_delta = MessageDelta(tokenizer).encode([messages[2]], ended_with_eos=True)
    second_turn = encode_text(tokenizer, answer_text) + eos
    loop_ids = prompt + first_turn + tool_delta + second_turn

    assert sft_ids[: len(loop_ids)] == loop_ids
    assert sft_ids[len(loop_ids) :] == encode_text(tokenizer, "\n")  # the template's newline after the last eos
    expected_mask = [0] * len(prompt) + [1] * len(first_turn) + [0] * len(tool_delta) + [1] * len(second_turn)
    assert sft_mask[: len(loop_ids)] == expected_mask
    parsed = ToolParser.get("hermes", tokenizer).parse(tokenizer.decode(first_turn[:-1]))
    assert [(c.name, c.arguments_dict()) for c in parsed.calls] == [("calculator", call)]
