"""Tests for hyflow.protocol.tensordict_io: DataProto <-> TensorDict, files, and verl's tensor serialisation helpers."""

import numpy as np
import torch
from tensordict import TensorDict

from hyflow.protocol import (
    DataProto,
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)


def agent_style_proto() -> DataProto:
    return DataProto.from_dict(
        tensors={"responses": torch.tensor([[7, 8], [9, 10]])},
        non_tensors={
            "turn_scores": [[], [0.5, 0.8]],
            "reward_extra_info": [{"acc": 1.0}, {"acc": 0.0}],
            "raw_prompt": [[{"role": "user", "content": "4 @ 2"}], [{"role": "user", "content": "8 @ 7"}]],
        },
        meta_info={"global_steps": 42},
    )


def test_to_tensordict_and_back_keeps_nested_rows_and_meta_info():
    data = agent_style_proto()
    back = DataProto.from_tensordict(data.to_tensordict())
    assert torch.equal(back.batch["responses"], data.batch["responses"])
    assert [list(row) for row in back.non_tensor_batch["turn_scores"]] == [[], [0.5, 0.8]]
    assert list(back.non_tensor_batch["reward_extra_info"]) == [{"acc": 1.0}, {"acc": 0.0}]
    assert back.non_tensor_batch["raw_prompt"][1] == [{"role": "user", "content": "8 @ 7"}]
    assert back.meta_info == {"global_steps": 42}


def test_save_to_disk_and_load_from_disk_give_the_same_dataproto(tmp_path):
    data = agent_style_proto()
    data.save_to_disk(tmp_path / "batch.pt")
    loaded = DataProto.load_from_disk(tmp_path / "batch.pt")
    assert torch.equal(loaded.batch["responses"], data.batch["responses"])
    assert list(loaded.non_tensor_batch["reward_extra_info"]) == list(data.non_tensor_batch["reward_extra_info"])
    assert loaded.meta_info == data.meta_info


def test_a_serialized_tensor_of_any_dtype_comes_back_bit_identical():
    for tensor in [torch.randn(3, 4), torch.randn(2, 3).bfloat16(), torch.tensor([[True, False]]), torch.arange(6)]:
        back = deserialize_single_tensor(serialize_single_tensor(tensor))
        assert back.dtype == tensor.dtype and back.shape == tensor.shape
        assert torch.equal(back.view(torch.uint8), tensor.contiguous().view(torch.uint8))


def test_a_serialized_tensordict_keeps_its_batch_size_and_nested_rows():
    nested = torch.nested.as_nested_tensor([torch.randn(2, 3), torch.randn(1, 3)], layout=torch.jagged)
    batch = TensorDict({"x": torch.randn(2, 5), "ragged": nested}, batch_size=[2])
    back = deserialize_tensordict(serialize_tensordict(batch))
    assert back.batch_size == batch.batch_size
    assert torch.equal(back["x"], batch["x"])
    for original, restored in zip(batch["ragged"].unbind(), back["ragged"].unbind(), strict=True):
        assert torch.equal(original, restored)


def test_from_tensordict_puts_non_tensor_stacks_in_object_columns():
    data = DataProto.from_tensordict(DataProto.from_dict(non_tensors={"label": ["a", "b"]}).to_tensordict())
    assert data.batch is None
    assert data.non_tensor_batch["label"].dtype == np.dtype(object)
    assert data.non_tensor_batch["label"].tolist() == ["a", "b"]
