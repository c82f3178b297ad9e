"""Tests for hyflow.protocol.verl_methods (verl's DataProto methods): mini-batches, repeats, folding, column chunks."""

import numpy as np
import pytest
import torch

from hyflow.protocol import DataProto, fold_batch_dim, unfold_batch_dim


def lettered(num_rows: int = 3) -> DataProto:
    return DataProto.from_dict(
        tensors={"obs": torch.arange(num_rows * 2).view(num_rows, 2)},
        non_tensors={"label": [chr(ord("a") + i) for i in range(num_rows)]},
        meta_info={"info": "x"},
    )


def test_make_iterator_gives_the_same_shuffled_mini_batches_for_the_same_seed():
    data = lettered(8)
    first = [part.non_tensor_batch["label"].tolist() for part in data.make_iterator(4, epochs=2, seed=3)]
    again = [part.non_tensor_batch["label"].tolist() for part in data.make_iterator(4, epochs=2, seed=3)]
    assert first == again
    assert len(first) == 4
    assert sorted(first[0] + first[1]) == list("abcdefgh")  # each epoch visits every row once


def test_make_iterator_rejects_a_mini_batch_size_that_does_not_divide_the_rows():
    with pytest.raises(ValueError, match="divides the 3 rows"):
        next(lettered(3).make_iterator(2, epochs=1))


def test_sample_level_repeat_repeats_each_row_its_own_number_of_times_in_order():
    repeated = lettered(3).sample_level_repeat(torch.tensor([3, 1, 2]))
    assert repeated.non_tensor_batch["label"].tolist() == ["a", "a", "a", "b", "c", "c"]
    assert repeated.batch["obs"][:, 0].tolist() == [0, 0, 0, 2, 4, 4]
    assert repeated.meta_info == {"info": "x"}


def test_fold_then_reorder_then_unfold_moves_whole_groups_of_rows():
    data = lettered(3).repeat(2, interleave=True)
    folded = fold_batch_dim(data, new_batch_size=3)
    assert folded.batch["obs"].shape == (3, 2, 2)
    assert folded.non_tensor_batch["label"].tolist() == [["a", "a"], ["b", "b"], ["c", "c"]]
    folded.reorder(torch.tensor([1, 2, 0]))
    unfolded = unfold_batch_dim(folded, batch_dims=2)
    assert unfolded.non_tensor_batch["label"].tolist() == ["b", "b", "c", "c", "a", "a"]
    assert unfolded.batch["obs"][:, 0].tolist() == [2, 2, 4, 4, 0, 0]


def test_unfold_column_chunks_splits_the_named_columns_and_repeats_the_rest():
    data = DataProto.from_dict(
        tensors={"long": torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]), "short": torch.tensor([[1], [2]])},
        non_tensors={"pair": [["a1", "a2"], ["b1", "b2"]]},
    )
    out = data.unfold_column_chunks(2, split_keys=["long", "pair"])
    assert out.batch["long"].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert out.batch["short"].tolist() == [[1], [1], [2], [2]]
    assert np.asarray(out.non_tensor_batch["pair"]).tolist() == [["a1"], ["a2"], ["b1"], ["b2"]]


def test_padding_appends_copies_of_the_last_row_in_place():
    data = lettered(3)
    data.padding(2)
    assert data.non_tensor_batch["label"].tolist() == ["a", "b", "c", "c", "c"]
