"""Mini- and micro-batch splitting, including the token budget of use_dynamic_bsz."""

import pytest
import torch
from tensordict import TensorDict

from hyflow.workers.batching import (
    pad_responses,
    restore_order,
    split_micro_batches,
    split_mini_batches,
    token_budget_bins,
    trim_padding,
)


def batch_with_lengths(lengths: list[int], width: int = 10) -> TensorDict:
    mask = (torch.arange(width) < torch.tensor(lengths)[:, None]).long()
    return TensorDict({"attention_mask": mask, "row": torch.arange(len(lengths))}, batch_size=[len(lengths)])


def test_token_budget_bins_hold_every_row_once_and_stay_within_the_budget():
    lengths = [9, 1, 5, 5, 3, 7, 2, 8]
    bins = token_budget_bins(lengths, max_token_len=12)
    assert sorted(row for rows in bins for row in rows) == list(range(len(lengths)))
    assert all(sum(lengths[r] for r in rows) <= 12 for rows in bins)
    assert len(bins) == 4  # 40 tokens need at least ceil(40 / 12) = 4


def test_a_sequence_longer_than_the_budget_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu=4"):
        token_budget_bins([3, 5], max_token_len=4)


def test_dynamic_micro_batches_restore_the_original_row_order():
    batch = batch_with_lengths([9, 1, 5, 5, 3, 7])
    micro_batches, bins = split_micro_batches(batch, max_token_len=12)
    assert len(micro_batches) > 1
    restored = restore_order([micro["row"] for micro in micro_batches], bins)
    assert torch.equal(restored, torch.arange(6))


def test_fixed_micro_batches_and_shuffled_mini_batches_cover_the_batch():
    batch = batch_with_lengths([1, 2, 3, 4, 5, 6])
    micro_batches, _ = split_micro_batches(batch, micro_batch_size=4)
    assert [m.batch_size[0] for m in micro_batches] == [4, 2]
    minis = split_mini_batches(batch, 3, shuffle=True, generator=torch.Generator().manual_seed(0))
    assert sorted(torch.cat([m["row"] for m in minis]).tolist()) == list(range(6))


def test_a_mini_batch_size_that_does_not_divide_the_rows_is_an_error():
    with pytest.raises(ValueError, match="not a multiple"):
        split_mini_batches(batch_with_lengths([1, 2, 3]), 2)


def test_trim_padding_drops_only_columns_that_are_padding_in_every_row():
    prompt_mask = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1]])
    response_mask = torch.tensor([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    micro = TensorDict(
        {"attention_mask": attention_mask, "responses": torch.arange(10).view(2, 5), "uid": torch.tensor([7, 8])},
        batch_size=[2],
    )
    trimmed = trim_padding(micro, multiple=1)
    assert torch.equal(trimmed["attention_mask"], attention_mask[:, 2:6])
    assert torch.equal(trimmed["responses"], micro["responses"][:, :2])
    assert torch.equal(trimmed["uid"], micro["uid"])
    assert torch.equal(pad_responses(trimmed["responses"], 5)[:, 2:], torch.zeros(2, 3, dtype=torch.long))
    aligned = trim_padding(micro, multiple=8)  # 4 columns rounded up to 8: 3 more on the right, 1 on the left
    assert torch.equal(aligned["attention_mask"], attention_mask[:, 1:9])
