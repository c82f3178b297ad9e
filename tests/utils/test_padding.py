import pytest
import torch
from tensordict import TensorDict

from hyflow.utils.padding import (
    build_attention_mask_from_nested,
    embeds_padding_2_no_padding,
    left_right_2_no_padding,
    no_padding_2_padding,
    response_from_nested,
    response_to_nested,
)


def _left_right_batch(prompt_lengths: list[int], response_lengths: list[int], prompt: int = 4, response: int = 3):
    """A batch of left-padded prompts and right-padded responses; token ids count 1.. within each row."""
    rows = len(prompt_lengths)
    input_ids = torch.zeros(rows, prompt + response, dtype=torch.long)
    attention_mask = torch.zeros(rows, prompt + response, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
        attention_mask[i, prompt - p : prompt + r] = 1
        input_ids[i, prompt - p : prompt + r] = torch.arange(1, p + r + 1) + 100 * i
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    data = TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "response_mask": attention_mask[:, prompt:].clone(),
            "position_ids": position_ids,
            "prompts": input_ids[:, :prompt],
            "responses": input_ids[:, prompt:],
        },
        batch_size=rows,
    )
    return data, input_ids, attention_mask


def test_the_nested_rows_hold_exactly_the_real_tokens_of_each_row():
    data, input_ids, attention_mask = _left_right_batch([2, 4], [3, 1])
    out = left_right_2_no_padding(data)
    for i in range(2):
        assert torch.equal(out["input_ids"][i], input_ids[i][attention_mask[i].bool()])
        assert torch.equal(out["position_ids"][i], torch.arange(int(attention_mask[i].sum())))
    assert torch.equal(out["loss_mask"], out["response_mask"])


def test_mrope_position_ids_keep_their_rows_and_lose_the_padding():
    data, _, attention_mask = _left_right_batch([1, 3], [2, 2])
    data["position_ids"] = torch.stack([data["position_ids"]] * 3, dim=1)  # (B, 3, T)
    out = left_right_2_no_padding(data)
    for i in range(2):
        assert out["position_ids"][i].shape == (3, int(attention_mask[i].sum()))


def test_back_to_padding_takes_the_output_one_position_before_each_response_token():
    data, input_ids, attention_mask = _left_right_batch([2, 4, 1], [3, 1, 2])
    out = left_right_2_no_padding(data)
    block = no_padding_2_padding(out["input_ids"], out)  # the "output" is the token itself: shifted by one
    for i in range(3):
        tokens = input_ids[i][attention_mask[i].bool()]
        r = int(attention_mask[i, 4:].sum())
        expected = torch.zeros(3, dtype=torch.long)
        expected[:r] = tokens[-r - 1 : -1]
        assert torch.equal(block[i], expected)


def test_back_to_padding_refuses_an_output_of_another_size():
    data, _, _ = _left_right_batch([2, 2], [1, 1])
    out = left_right_2_no_padding(data)
    with pytest.raises(ValueError, match=r"holds 5 tokens.*hold 6"):
        no_padding_2_padding(torch.zeros(5), out)


def test_left_right_2_no_padding_names_the_missing_keys():
    with pytest.raises(ValueError, match=r"missing \['position_ids'\]"):
        keys = ("input_ids", "attention_mask", "response_mask")
        left_right_2_no_padding(TensorDict({key: torch.ones(1, 2) for key in keys}, batch_size=1))


def test_attention_mask_from_nested_marks_each_rows_length():
    ids = torch.nested.as_nested_tensor([torch.ones(3), torch.ones(1)], layout=torch.jagged)
    assert build_attention_mask_from_nested(ids).tolist() == [[1, 1, 1], [1, 0, 0]]


def test_responses_move_between_padded_and_nested_rows():
    output = torch.nested.as_nested_tensor([torch.arange(5.0), torch.arange(4.0)], layout=torch.jagged)
    mask = torch.nested.as_nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    assert [row.tolist() for row in response_from_nested(output, mask).unbind()] == [[2.0, 3.0], [0.0, 1.0, 2.0]]
    padded = torch.arange(8.0).view(2, 4)
    assert [row.tolist() for row in response_to_nested(padded, mask).unbind()] == [[0.0, 1.0], [4.0, 5.0, 6.0]]


def test_embeddings_keep_only_their_masked_positions():
    embeds = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    out = embeds_padding_2_no_padding(TensorDict({"prompt_embeds": embeds, "prompt_embeds_mask": mask}, 2))
    assert torch.equal(out["prompt_embeds"][0], embeds[0, :2])
    assert torch.equal(out["prompt_embeds"][1], embeds[1])
