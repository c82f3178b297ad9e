"""Tests for hyflow.protocol.dataproto: DataProto operations, error messages, pickling (futures: see test_future)."""

import copy
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from hyflow.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto


def make_proto(num_rows: int = 4, meta_info: dict | None = None) -> DataProto:
    """Rows i = 0..num_rows-1 carry input_ids [i, i] and uid 'u{i}', so row identity is easy to check."""
    rows = torch.arange(num_rows)
    return DataProto.from_single_dict(
        {
            "input_ids": torch.stack([rows, rows], dim=1),
            "values": rows.float().unsqueeze(1),
            "uid": np.array([f"u{i}" for i in range(num_rows)], dtype=object),
            "reward_model": [{"ground_truth": str(i)} for i in range(num_rows)],
        },
        meta_info=meta_info if meta_info is not None else {"temperature": 1.0},
    )


def row_ids(data: DataProto) -> list[int]:
    return data.batch["input_ids"][:, 0].tolist()


# ---- construction ----
def test_from_single_dict_puts_tensors_in_batch_and_arrays_in_non_tensor_batch():
    data = make_proto(3)
    assert list(data.batch.keys()) == ["input_ids", "values"]
    assert set(data.non_tensor_batch) == {"uid", "reward_model"}
    assert data.batch.batch_size == torch.Size([3])
    assert data.meta_info == {"temperature": 1.0}
    assert len(data) == 3


def test_from_dict_builds_a_tensordict_with_one_batch_dimension():
    data = DataProto.from_dict({"responses": torch.zeros(2, 5)}, {"uid": ["a", "b"]}, {"validate": True})
    assert isinstance(data.batch, TensorDict)
    assert data.batch.batch_size == torch.Size([2])
    assert data.non_tensor_batch["uid"].dtype == object
    assert data.meta_info["validate"] is True


def test_list_of_equal_length_lists_stays_a_one_dimensional_object_array():
    data = DataProto.from_dict(non_tensors={"raw_prompt_ids": [[1, 2], [3, 4], [5, 6]]})
    array = data.non_tensor_batch["raw_prompt_ids"]
    assert array.shape == (3,)
    assert array[1] == [3, 4]


def test_numpy_array_of_dicts_stays_one_dimensional_and_numeric_arrays_become_object():
    dicts = np.array([{"a": 1}, {"a": 2}])
    data = DataProto.from_dict(non_tensors={"extra_info": dicts, "index": np.array([7, 8])})
    assert data.non_tensor_batch["extra_info"].shape == (2,)
    assert data.non_tensor_batch["index"].dtype == object
    assert data.non_tensor_batch["index"].tolist() == [7, 8]


def test_meta_only_proto_has_length_zero():
    assert len(DataProto(meta_info={"metrics": {"loss": 1.0}})) == 0
    assert len(DataProto()) == 0


def test_tensors_with_different_row_counts_are_rejected_naming_both_keys():
    with pytest.raises(ValueError, match=r"tensor 'values' has 3 rows but 'input_ids' has 2"):
        DataProto.from_dict({"input_ids": torch.zeros(2, 4), "values": torch.zeros(3, 4)})


def test_non_tensor_array_with_wrong_length_is_rejected_naming_the_key_and_both_lengths():
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] has 3 rows but batch has 2"):
        DataProto.from_dict({"input_ids": torch.zeros(2, 4)}, {"uid": ["a", "b", "c"]})


def test_non_tensor_arrays_of_different_lengths_are_rejected_without_a_batch():
    with pytest.raises(ValueError, match=r"non_tensor_batch\['b'\] has 3 rows but non_tensor_batch\['a'\] has 2"):
        DataProto(non_tensor_batch={"a": [1, 2], "b": [1, 2, 3]})


def test_batch_that_is_not_a_tensordict_is_rejected_with_the_fix():
    with pytest.raises(TypeError, match=r"must be a tensordict.TensorDict.*DataProto.from_dict"):
        DataProto(batch={"input_ids": torch.zeros(2, 3)})


def test_batch_with_two_batch_dimensions_is_rejected():
    batch = TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2, 3])
    with pytest.raises(ValueError, match=r"one batch dimension.*got batch_size=\[2, 3\]"):
        DataProto(batch=batch)


def test_from_single_dict_rejects_a_scalar_and_points_to_meta_info():
    with pytest.raises(ValueError, match=r"'temperature' is a float.*meta_info"):
        DataProto.from_single_dict({"input_ids": torch.zeros(2, 3), "temperature": 0.7})


def test_non_tensor_value_that_is_not_an_array_or_list_is_rejected():
    with pytest.raises(TypeError, match=r"non_tensor_batch\['uid'\] is a str"):
        DataProto(non_tensor_batch={"uid": "abc"})


# ---- indexing ----
def test_int_index_returns_a_one_row_dataproto_and_negative_ints_count_from_the_end():
    data = make_proto(4)
    assert isinstance(data[1], DataProto)
    assert row_ids(data[1]) == [1]
    assert row_ids(data[-1]) == [3]
    assert data[-1].non_tensor_batch["uid"].tolist() == ["u3"]
    with pytest.raises(IndexError, match="row 4 is out of range for a DataProto of 4 rows"):
        data[4]


def test_slice_index_keeps_rows_and_meta_info():
    part = make_proto(5)[1:4]
    assert row_ids(part) == [1, 2, 3]
    assert part.non_tensor_batch["uid"].tolist() == ["u1", "u2", "u3"]
    assert part.meta_info == {"temperature": 1.0}


@pytest.mark.parametrize(
    "index",
    [
        torch.tensor([3, 0]),
        np.array([3, 0]),
        [3, 0],
    ],
)
def test_integer_index_tensor_array_or_list_picks_rows_in_order(index):
    part = make_proto(4)[index]
    assert row_ids(part) == [3, 0]
    assert part.non_tensor_batch["uid"].tolist() == ["u3", "u0"]


@pytest.mark.parametrize("mask", [torch.tensor([True, False, True, False]), np.array([True, False, True, False])])
def test_boolean_mask_picks_the_true_rows(mask):
    part = make_proto(4)[mask]
    assert row_ids(part) == [0, 2]
    assert part.non_tensor_batch["reward_model"].tolist() == [{"ground_truth": "0"}, {"ground_truth": "2"}]


def test_boolean_mask_of_wrong_length_is_rejected():
    with pytest.raises(IndexError, match="boolean index has length 3 but the DataProto has 4 rows"):
        make_proto(4)[np.array([True, False, True])]


def test_out_of_range_index_array_is_rejected():
    with pytest.raises(IndexError, match=r"rows must lie in \[-4, 4\)"):
        make_proto(4)[[0, 9]]


def test_float_index_array_is_rejected():
    with pytest.raises(IndexError, match="integers or booleans, got dtype float"):
        make_proto(4)[np.array([0.0, 1.0])]


# ---- select, pop, union ----
def test_select_keeps_only_the_named_keys_and_none_keeps_all():
    data = make_proto(3)
    picked = data.select(batch_keys=["values"], non_tensor_batch_keys=["uid"], meta_info_keys=[])
    assert list(picked.batch.keys()) == ["values"]
    assert list(picked.non_tensor_batch) == ["uid"]
    assert picked.meta_info == {}
    everything = data.select()
    assert set(everything.keys()) == set(data.keys())
    assert everything.meta_info == data.meta_info


def test_select_without_deepcopy_shares_storage_and_with_deepcopy_does_not():
    data = make_proto(3, meta_info={"metrics": {"a": [1]}})
    shared = data.select(batch_keys=["values"])
    copied = data.select(batch_keys=["values"], deepcopy=True)
    data.batch["values"][0, 0] = 100.0
    data.meta_info["metrics"]["a"].append(2)
    assert shared.batch["values"][0, 0].item() == 100.0
    assert copied.batch["values"][0, 0].item() == 0.0
    assert copied.meta_info["metrics"] == {"a": [1]}


def test_select_of_a_missing_key_names_it_lists_the_available_ones_and_suggests_a_close_field():
    with pytest.raises(KeyError) as info:
        make_proto(2).select(batch_keys=["old_log_prob"])
    message = str(info.value)
    assert "DataProto.batch has no key ['old_log_prob']" in message
    assert "available: ['input_ids', 'values']" in message
    assert "did you mean 'old_log_probs'?" in message


def test_pop_removes_the_keys_and_returns_them():
    data = make_proto(3)
    popped = data.pop(batch_keys=["values"], non_tensor_batch_keys=["uid"], meta_info_keys=["temperature"])
    assert list(popped.batch.keys()) == ["values"]
    assert popped.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2"]
    assert popped.meta_info == {"temperature": 1.0}
    assert list(data.batch.keys()) == ["input_ids"]
    assert list(data.non_tensor_batch) == ["reward_model"]
    assert data.meta_info == {}
    assert len(data) == 3


def test_pop_of_a_missing_key_changes_nothing():
    data = make_proto(2)
    with pytest.raises(KeyError, match=r"DataProto\.non_tensor_batch has no key"):
        data.pop(batch_keys=["values"], non_tensor_batch_keys=["raw_prompt"])
    assert "values" in list(data.batch.keys())


def test_union_merges_new_keys_in_place_and_accepts_equal_values_for_shared_keys():
    data = make_proto(3)
    extra = DataProto.from_dict(
        {"values": data.batch["values"].clone(), "advantages": torch.ones(3, 1)},
        {"uid": data.non_tensor_batch["uid"].copy(), "data_source": ["gsm8k"] * 3},
        {"temperature": 1.0, "global_steps": 7},
    )
    merged = data.union(extra)
    assert merged is data
    assert set(data.batch.keys()) == {"input_ids", "values", "advantages"}
    assert set(data.non_tensor_batch) == {"uid", "reward_model", "data_source"}
    assert data.meta_info == {"temperature": 1.0, "global_steps": 7}


def test_union_into_a_proto_without_batch_takes_the_other_batch():
    data = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    data.union(DataProto.from_dict({"responses": torch.zeros(2, 3)}))
    assert data.batch["responses"].shape == (2, 3)


@pytest.mark.parametrize(
    ("tensors", "non_tensors", "meta_info", "where"),
    [
        ({"values": torch.full((3, 1), 9.0)}, {}, {}, r"batch\['values'\]"),
        ({"values": torch.arange(3).unsqueeze(1)}, {}, {}, r"batch\['values'\]"),
        ({}, {"uid": ["x", "y", "z"]}, {}, r"non_tensor_batch\['uid'\]"),
        ({}, {}, {"temperature": 0.5}, r"meta_info\['temperature'\]"),
    ],
)
def test_union_with_a_conflicting_value_names_the_key_and_merges_nothing(tensors, non_tensors, meta_info, where):
    data = make_proto(3)
    other = DataProto.from_dict(tensors, {**non_tensors, "data_source": ["new"] * 3}, {**meta_info, "validate": True})
    with pytest.raises(ValueError, match=rf"union conflict on {where}.*different values"):
        data.union(other)
    assert "data_source" not in data.non_tensor_batch
    assert data.meta_info == {"temperature": 1.0}


def test_union_of_different_row_counts_is_rejected():
    with pytest.raises(ValueError, match="cannot union DataProtos of 3 and 2 rows"):
        make_proto(3).union(make_proto(2))


def test_union_of_a_meta_only_proto_merges_its_meta_info_into_any_batch():
    data = make_proto(3).union(DataProto(meta_info={"metrics": {"actor/loss": 0.5}}))
    assert data.meta_info == {"temperature": 1.0, "metrics": {"actor/loss": 0.5}}
    merged = DataProto(meta_info={"global_steps": 1}).union(make_proto(2))
    assert len(merged) == 2
    assert merged.meta_info == {"global_steps": 1, "temperature": 1.0}


def test_union_checks_rows_even_when_every_batch_key_was_popped():
    data = make_proto(3)
    data.pop(batch_keys=["input_ids", "values"], non_tensor_batch_keys=["uid", "reward_model"])
    with pytest.raises(ValueError, match="cannot union DataProtos of 3 and 2 rows"):
        data.union(make_proto(2))


def test_union_compares_dict_and_array_elements_without_ambiguity_errors():
    arrays = [np.array([1, 2]), np.array([3, 4])]
    data = DataProto.from_dict(non_tensors={"raw_prompt_ids": arrays})
    data.union(DataProto.from_dict(non_tensors={"raw_prompt_ids": [a.copy() for a in arrays]}))
    with pytest.raises(ValueError, match="union conflict"):
        data.union(DataProto.from_dict(non_tensors={"raw_prompt_ids": [np.array([1, 2]), np.array([3, 5])]}))


# ---- concat, split, chunk, repeat ----
def test_concat_joins_rows_and_merges_the_meta_info_keys_of_every_part():
    parts = [make_proto(2, {"temperature": 1.0}), make_proto(3, {"temperature": 1.0, "validate": True})]
    joined = DataProto.concat(parts)
    assert len(joined) == 5
    assert row_ids(joined) == [0, 1, 0, 1, 2]
    assert joined.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u0", "u1", "u2"]
    assert joined.meta_info == {"temperature": 1.0, "validate": True}


def test_concat_rejects_parts_that_disagree_on_a_meta_info_value():
    parts = [make_proto(2, {"temperature": 1.0}), make_proto(3, {"temperature": 0.5})]
    with pytest.raises(ValueError, match="Conflicting values for meta_info key 'temperature'"):
        DataProto.concat(parts)


def test_concat_gathers_every_parts_metrics_into_lists_and_keeps_the_slowest_timing():
    parts = [
        make_proto(2, {"metrics": {"loss": 0.5}, "timing": {"gen": 1.0, "ref": 3.0}}),
        make_proto(2, {"timing": {"gen": 2.0}}),
        make_proto(2, {"metrics": [{"loss": 0.7}, {"loss": 0.9}], "timing": {"gen": 1.5}}),
    ]
    joined = DataProto.concat(parts)
    assert joined.meta_info["metrics"] == {"loss": [0.5, 0.7, 0.9]}
    assert joined.meta_info["timing"] == {"gen": 2.0, "ref": 3.0}


def test_errors_of_dataproto_operations_are_also_assertion_errors_like_verls():
    with pytest.raises(AssertionError):
        make_proto(5).chunk(2)


def test_chunk_with_auto_padding_cuts_near_equal_parts():
    data = DataProto.from_dict({"x": torch.arange(5)}, auto_padding=True)
    assert [part.batch["x"].tolist() for part in data.chunk(2)] == [[0, 1, 2], [3, 4]]


def test_the_process_wide_auto_padding_setting_lets_every_dataproto_chunk_uneven_rows(monkeypatch):
    from hyflow.protocol import DataProtoConfig

    monkeypatch.setattr(DataProtoConfig, "auto_padding", True)
    data = DataProto.from_dict({"x": torch.arange(5)})
    assert data.is_padding_enabled()
    assert [len(part) for part in data.chunk(2)] == [3, 2]


def test_concat_with_different_keys_lists_the_differing_keys():
    with pytest.raises(ValueError) as info:
        DataProto.concat([make_proto(2), make_proto(2).select(batch_keys=["input_ids"])])
    message = str(info.value)
    assert "part 1 has different batch keys than part 0" in message
    assert "only in part 0: ['values'], only in part 1: []" in message


def test_concat_with_different_non_tensor_keys_lists_them():
    with pytest.raises(ValueError, match=r"non_tensor_batch keys.*only in part 0: \['reward_model'\]"):
        DataProto.concat([make_proto(2), make_proto(2).select(non_tensor_batch_keys=["uid"])])


def test_concat_with_different_response_lengths_names_the_key_and_shapes():
    short = DataProto.from_dict({"responses": torch.zeros(2, 3)})
    long = DataProto.from_dict({"responses": torch.zeros(2, 5)})
    with pytest.raises(ValueError, match=r"batch\['responses'\] has per-row shape \[5\] in part 1 but \[3\] in part 0"):
        DataProto.concat([short, long])


def test_concat_of_an_empty_list_is_rejected():
    with pytest.raises(ValueError, match="empty list"):
        DataProto.concat([])


def test_split_gives_parts_of_the_size_and_a_shorter_last_part():
    parts = make_proto(5).split(2)
    assert [row_ids(p) for p in parts] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="split_size must be a positive int, got 0"):
        make_proto(5).split(0)


def test_chunk_gives_equal_parts_that_concat_back_to_the_original():
    data = make_proto(6)
    parts = data.chunk(3)
    assert [row_ids(p) for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert [p.non_tensor_batch["uid"].tolist() for p in parts][2] == ["u4", "u5"]
    back = DataProto.concat(parts)
    assert torch.equal(back.batch["input_ids"], data.batch["input_ids"])
    assert back.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()


def test_chunk_into_a_count_that_does_not_divide_suggests_pad_to_divisor():
    with pytest.raises(ValueError, match=r"cannot chunk a DataProto of 5 rows into 2 equal parts.*pad_to_divisor\(2\)"):
        make_proto(5).chunk(2)
    with pytest.raises(ValueError, match="chunks must be a positive int"):
        make_proto(4).chunk(0)


def test_repeat_interleaved_gives_aabb_and_tiled_gives_abab():
    data = make_proto(2)
    assert row_ids(data.repeat(2, interleave=True)) == [0, 0, 1, 1]
    assert data.repeat(2, interleave=True).non_tensor_batch["uid"].tolist() == ["u0", "u0", "u1", "u1"]
    assert row_ids(data.repeat(3, interleave=False)) == [0, 1, 0, 1, 0, 1]
    assert data.repeat(3, interleave=False).meta_info == data.meta_info
    with pytest.raises(ValueError, match="repeat_times must be a positive int, got 0"):
        data.repeat(0)


# ---- padding ----
def test_pad_to_divisor_repeats_rows_from_the_start_and_unpad_removes_them():
    data = make_proto(5)
    padded, pad_size = data.pad_to_divisor(4)
    assert pad_size == 3
    assert row_ids(padded) == [0, 1, 2, 3, 4, 0, 1, 2]
    assert padded.non_tensor_batch["uid"].tolist()[-3:] == ["u0", "u1", "u2"]
    assert row_ids(padded.unpad(pad_size)) == [0, 1, 2, 3, 4]


def test_pad_to_divisor_cycles_when_the_pad_is_longer_than_the_batch():
    padded, pad_size = make_proto(2).pad_to_divisor(7)
    assert pad_size == 5
    assert row_ids(padded) == [0, 1, 0, 1, 0, 1, 0]


def test_pad_to_divisor_of_a_divisible_or_empty_batch_adds_nothing():
    data = make_proto(4)
    padded, pad_size = data.pad_to_divisor(2)
    assert pad_size == 0
    assert padded.unpad(0) is padded
    assert len(padded) == 4
    assert make_proto(3)[0:0].pad_to_divisor(2)[1] == 0


def test_module_level_pad_and_unpad_match_the_methods():
    padded, pad_size = pad_dataproto_to_divisor(make_proto(3), 2)
    assert (len(padded), pad_size) == (4, 1)
    assert len(unpad_dataproto(padded, pad_size)) == 3


def test_padding_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="divisor must be a positive int, got 0"):
        make_proto(3).pad_to_divisor(0)
    with pytest.raises(ValueError, match=r"pad_size must lie in \[0, 3\].*got 4"):
        make_proto(3).unpad(4)


# ---- devices, pickling, printing ----
def test_to_moves_the_batch_and_returns_self():
    data = make_proto(2)
    assert data.to("cpu") is data
    assert data.batch["input_ids"].device.type == "cpu"
    assert DataProto(non_tensor_batch={"uid": ["a"]}).to("cpu").batch is None


def test_pickle_and_deepcopy_round_trip_every_part():
    data = make_proto(3, meta_info={"temperature": 0.7, "metrics": {"x": 1.0}})
    for copied in (pickle.loads(pickle.dumps(data)), copy.deepcopy(data)):
        assert torch.equal(copied.batch["input_ids"], data.batch["input_ids"])
        assert copied.non_tensor_batch["reward_model"].tolist() == data.non_tensor_batch["reward_model"].tolist()
        assert copied.meta_info == data.meta_info
        assert copied.batch.batch_size == torch.Size([3])


def test_pickling_a_slice_does_not_ship_the_whole_batch():
    data = DataProto.from_dict({"values": torch.zeros(1000, 100)})
    assert len(pickle.dumps(data[:10])) < len(pickle.dumps(data)) // 20
    assert torch.equal(pickle.loads(pickle.dumps(data[990:])).batch["values"], torch.zeros(10, 100))


def test_repr_shows_length_keys_dtypes_and_shapes():
    text = repr(make_proto(3))
    assert text.startswith("DataProto(len=3")
    assert "input_ids: int64[3, 2]" in text
    assert "values: float32[3, 1]" in text
    assert "uid: object[3]" in text
    assert "meta_info_keys=['temperature']" in text


def test_importing_the_protocol_does_not_import_ray():
    code = "import sys, hyflow.protocol; assert 'ray' not in sys.modules, 'ray was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_union_treats_nan_in_the_same_place_as_equal_and_a_different_value_as_a_conflict():
    from hyflow.protocol import union_numpy_dict

    mine = {"score": np.array([1.0, np.nan, 3.0])}
    union_numpy_dict(mine, {"score": np.array([1.0, np.nan, 3.0]), "extra": np.array([1, 2, 3])})
    assert set(mine) == {"score", "extra"}
    with pytest.raises(AssertionError, match="`score` in tensor_dict1 and tensor_dict2 are not the same"):
        union_numpy_dict(mine, {"score": np.array([np.nan, 1.0, 3.0])})


def test_union_of_self_referencing_object_arrays_terminates():
    from hyflow.protocol import union_numpy_dict

    loop_a, loop_b = np.array([None], dtype=object), np.array([None], dtype=object)
    loop_a[0], loop_b[0] = loop_a, loop_b
    union_numpy_dict({"x": loop_a}, {"x": loop_b})
    with pytest.raises(ValueError):
        union_numpy_dict({"x": loop_a}, {"x": np.array([None], dtype=object)})
