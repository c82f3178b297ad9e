"""SFTDataset: chat conversations tokenised with the template, loss mask exactly on the assistant tokens."""

import pytest
import torch

from hyflow import fields as F
from hyflow.config.sft import SFTDataConfig
from hyflow.data.sft_dataset import LOSS_MASK, SFTDataset, collate_sft, tokenize_conversation

PARAMETERS = {"type": "object", "properties": {"e": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "evaluate", "parameters": PARAMETERS}}]
CONVERSATION = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "Compute 1 + 2."},
    {"role": "assistant", "content": "<answer>3</answer>"},
    {"role": "user", "content": "Now add 5."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"e": "3+5"}}}],
    },
    {"role": "tool", "content": "8"},
    {"role": "assistant", "content": "<answer>8</answer>"},
]
ASSISTANT_TEXTS = [
    "<answer>3</answer><|im_end|>",
    '<tool_call>\n{"name": "calc", "arguments": {"e": "3+5"}}\n</tool_call><|im_end|>',
    "<answer>8</answer><|im_end|>",
]


def masked_spans(tokenizer, ids, mask):
    """The decoded text of each run of consecutive mask-1 tokens."""
    spans, current = [], []
    for token, trained in zip(ids, mask):
        if trained:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    if current:
        spans.append(tokenizer.decode(current))
    return spans


def test_loss_mask_covers_exactly_the_assistant_turns_of_a_multi_turn_tool_conversation(tokenizer):
    ids, mask = tokenize_conversation(tokenizer, CONVERSATION, TOOLS)
    assert masked_spans(tokenizer, ids, mask) == ASSISTANT_TEXTS


def test_token_ids_equal_the_tokenisation_of_the_whole_rendered_conversation(tokenizer):
    ids, mask = tokenize_conversation(tokenizer, CONVERSATION, TOOLS)
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert len(mask) == len(ids)


def test_dataset_reads_messages_and_tools_columns(tokenizer, write_rows):
    path = write_rows([{"messages": CONVERSATION, "tools": TOOLS}, {"messages": CONVERSATION[:3], "tools": None}])
    dataset = SFTDataset(path, tokenizer, SFTDataConfig(max_length=512))
    assert len(dataset) == 2
    item = dataset[0]
    assert masked_spans(tokenizer, item[F.INPUT_IDS].tolist(), item[LOSS_MASK].tolist()) == ASSISTANT_TEXTS
    item = dataset[1]
    assert masked_spans(tokenizer, item[F.INPUT_IDS].tolist(), item[LOSS_MASK].tolist()) == ASSISTANT_TEXTS[:1]


def test_rows_of_the_rl_schema_train_on_the_response_named_by_response_key(tokenizer, write_rows):
    row = {"prompt": [{"role": "user", "content": "Compute 4 + 5."}], "extra_info": {"answer": "<answer>9</answer>"}}
    config = SFTDataConfig(response_key="extra_info.answer")
    dataset = SFTDataset(write_rows([row]), tokenizer, config)
    item = dataset[0]
    assert masked_spans(tokenizer, item[F.INPUT_IDS].tolist(), item[LOSS_MASK].tolist()) == [
        "<answer>9</answer><|im_end|>"
    ]


def test_overlong_conversation_is_an_error_naming_the_row_and_the_fix(tokenizer, write_rows):
    path = write_rows([{"messages": CONVERSATION[1:3]}, {"messages": CONVERSATION}])
    with pytest.raises(ValueError, match=r"row 1.*data.max_length=40.*data.truncation"):
        SFTDataset(path, tokenizer, SFTDataConfig(max_length=40))


@pytest.mark.parametrize("mode", ["left", "right"])
def test_truncation_keeps_the_end_when_left_and_the_start_when_right(tokenizer, write_rows, mode):
    path = write_rows([{"messages": CONVERSATION}])
    full_ids, _ = tokenize_conversation(tokenizer, CONVERSATION)
    dataset = SFTDataset(path, tokenizer, SFTDataConfig(max_length=40, truncation=mode))
    ids = dataset[0][F.INPUT_IDS].tolist()
    assert ids == (full_ids[-40:] if mode == "left" else full_ids[:40])


def test_conversation_without_an_assistant_turn_is_rejected(tokenizer, write_rows):
    path = write_rows([{"messages": CONVERSATION[:2]}])
    with pytest.raises(ValueError, match="no assistant turn"):
        SFTDataset(path, tokenizer, SFTDataConfig())


def test_missing_messages_column_names_the_key_to_set(tokenizer, write_rows):
    path = write_rows([{"chat": CONVERSATION}])
    with pytest.raises(ValueError, match=r"column 'messages'.*data.messages_key"):
        SFTDataset(path, tokenizer, SFTDataConfig())


def test_collate_right_pads_to_the_longest_item_with_positions_over_real_tokens():
    items = [
        {F.INPUT_IDS: torch.tensor([5, 6, 7]), LOSS_MASK: torch.tensor([0, 1, 1])},
        {F.INPUT_IDS: torch.tensor([8]), LOSS_MASK: torch.tensor([1])},
    ]
    batch = collate_sft(items, pad_token_id=0, pad_to_multiple_of=4)
    assert batch[F.INPUT_IDS].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert batch[F.ATTENTION_MASK].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert batch[F.POSITION_IDS].tolist() == [[0, 1, 2, 2], [0, 0, 0, 0]]
    assert batch[LOSS_MASK].tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]
