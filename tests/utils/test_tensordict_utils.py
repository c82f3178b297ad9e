"""A TensorDict as a whole batch (hyflow.utils.tensordict_utils): columns, nested rows and batch-level values."""

import pytest
import torch

from hyflow.protocol.values import DataProtoError
from hyflow.utils import tensordict_utils as tu


def ragged(*lengths: int) -> torch.Tensor:
    return torch.nested.as_nested_tensor([torch.arange(n) for n in lengths], layout=torch.jagged)


def test_get_tensordict_keeps_lists_as_columns_and_batch_values_whole():
    td = tu.get_tensordict({"obs": torch.ones(3, 2), "turns": [[], [0.5], [1, 2]]}, {"cfg": {"top_p": 0.7}})
    assert td.batch_size == torch.Size([3])
    assert tu.get(td, "turns") == [[], [0.5], [1, 2]]
    assert tu.get(td, "cfg") == {"top_p": 0.7}
    assert tu.get(td, "absent", default=4) == 4


def test_get_tensordict_names_the_column_whose_row_count_differs():
    with pytest.raises(DataProtoError, match=r"'obs': 3.*'uid': 2"):
        tu.get_tensordict({"obs": torch.ones(3), "uid": ["a", "b"]})


def test_get_tensordict_refuses_a_list_of_tensors_with_the_fix():
    with pytest.raises(DataProtoError, match="nested_tensor_from_tensor_list"):
        tu.get_tensordict({"images": [torch.ones(2), torch.ones(3)]})


def test_index_select_takes_rows_of_nested_tensors_and_columns():
    td = tu.get_tensordict({"ids": ragged(2, 5, 3), "uid": ["a", "b", "c"]}, {"step": 1})
    picked = tu.index_select_tensor_dict(td, [2, 0])
    assert [row.tolist() for row in picked["ids"].unbind()] == [[0, 1, 2], [0, 1]]
    assert tu.get(picked, "uid") == ["c", "a"] and tu.get(picked, "step") == 1


def test_chunk_keeps_the_ragged_dimension_of_3d_position_ids():
    rows = [torch.arange(n).expand(4, n) for n in (2, 2, 5, 5)]
    td = tu.get_tensordict({"position_ids": tu.nested_tensor_from_tensor_list(rows)})
    _, second = tu.chunk_tensordict(td, 2)
    assert second["position_ids"]._ragged_idx == 2
    assert torch.equal(second["position_ids"].unbind()[1], rows[3])


def test_chunk_refuses_rows_that_do_not_divide():
    with pytest.raises(DataProtoError, match="cannot chunk 3 rows into 2"):
        tu.chunk_tensordict(tu.get_tensordict({"obs": torch.ones(3)}), 2)


def test_concat_joins_nested_rows_and_keeps_the_first_parts_batch_values():
    a = tu.get_tensordict({"ids": ragged(1, 2), "uid": ["a", "b"]}, {"temperature": 1.0})
    b = tu.get_tensordict({"ids": ragged(3, 4), "uid": ["c", "d"]}, {"temperature": 2.0})
    joined = tu.concat_tensordict([a, b])
    assert joined["ids"].offsets().tolist() == [0, 1, 3, 6, 10]
    assert tu.get(joined, "uid") == ["a", "b", "c", "d"] and tu.get(joined, "temperature") == 1.0


def test_pad_to_divisor_repeats_the_first_rows_and_unpad_removes_them():
    td = tu.get_tensordict({"obs": torch.tensor([1, 2, 3]), "uid": ["a", "b", "c"]})
    padded, pad_size = tu.pad_to_divisor(td, 7)
    assert pad_size == 4 and padded["obs"].tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert tu.get(tu.unpad(padded, pad_size), "uid") == ["a", "b", "c"]


def test_make_iterator_gives_the_same_shuffled_batches_for_the_same_seed():
    td = tu.get_tensordict({"obs": torch.arange(6)})

    def batches(seed):
        it = tu.make_iterator(td, mini_batch_size=2, epochs=2, seed=seed, dataloader_kwargs={"shuffle": True})
        return [part["obs"].tolist() for part in it]

    assert batches(1) == batches(1) and len(batches(1)) == 6
    assert sorted(x for part in batches(1)[:3] for x in part) == list(range(6))


def test_pop_keys_moves_columns_and_batch_values_out():
    td = tu.get_tensordict({"obs": torch.ones(2), "uid": ["a", "b"]}, {"step": 3})
    popped = tu.pop_keys(td, ["uid", "step"])
    assert set(td.keys()) == {"obs"} and tu.get(popped, "uid") == ["a", "b"] and tu.get(popped, "step") == 3
    with pytest.raises(KeyError, match="'uid'"):
        tu.pop_keys(td, ["uid"])


def test_union_refuses_a_batch_value_both_sides_hold_differently():
    a = tu.get_tensordict({"obs": torch.ones(2)}, {"top_p": 0.8})
    b = tu.get_tensordict({"act": torch.zeros(2)}, {"top_p": 0.9})
    with pytest.raises(AssertionError, match="top_p"):
        tu.union_tensor_dict(a, b)


def test_assert_tensordict_eq_names_the_differing_nested_key():
    a = tu.get_tensordict({"ids": ragged(2, 3)})
    tu.assert_tensordict_eq(a, tu.get_tensordict({"ids": ragged(2, 3)}))
    with pytest.raises(AssertionError, match="'ids'"):
        tu.assert_tensordict_eq(a, tu.get_tensordict({"ids": ragged(3, 2)}))


def test_contiguous_makes_a_sliced_tensor_contiguous():
    td = tu.get_tensordict({"b": torch.randn(3, 4)[:, :-1], "uid": ["a", "b", "c"]})
    assert tu.contiguous(td)["b"].is_contiguous()


def test_list_of_dict_nests_ragged_tensors_and_stacks_equal_ones():
    td = tu.list_of_dict_to_tensordict(
        [{"ids": torch.arange(2), "x": torch.ones(3)}, {"ids": torch.arange(4), "x": torch.ones(3)}]
    )
    assert td["ids"].is_nested and td["x"].shape == (2, 3)
