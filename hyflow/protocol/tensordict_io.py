"""DataProto in other containers: a `tensordict.TensorDict` with non-tensor stacks, bytes for transport, a file.

Private helpers of the `DataProto` methods `to_tensordict` and `from_tensordict` (verl_methods.py), plus verl's
serialisation helpers under verl's names so ported code keeps working:

    dtype, shape, data = serialize_single_tensor(t)          # data: the raw bytes as a uint8 numpy array
    t2 = deserialize_single_tensor((dtype, shape, data))
    batch_size, device, items = serialize_tensordict(td)     # nested (jagged) tensors are kept per row
    td2 = deserialize_tensordict((batch_size, device, items))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

__all__ = [
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "serialize_single_tensor",
    "serialize_tensordict",
]


def serialize_single_tensor(tensor: torch.Tensor) -> tuple[str, torch.Size, np.ndarray]:
    """(dtype name, shape, the tensor's bytes as a flat uint8 array): any dtype, bf16 and fp8 included."""
    data = tensor.detach().cpu().flatten().contiguous().view(torch.uint8).numpy()
    return str(tensor.dtype).removeprefix("torch."), tensor.shape, data


def deserialize_single_tensor(encoded: tuple[str, Any, Any]) -> torch.Tensor:
    """The tensor that `serialize_single_tensor` encoded (a fresh, writable CPU tensor)."""
    dtype_name, shape, data = encoded
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"serialized tensor names dtype {dtype_name!r}, which is not a torch dtype.")
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
    return raw.view(dtype).view(tuple(shape))


def serialize_tensordict(batch: TensorDict) -> tuple[tuple[int, ...], str | None, dict[str, Any]]:
    """(batch size, device, {key: encoded tensor}); a nested tensor becomes (layout, [encoded row, ...])."""
    items: dict[str, Any] = {}
    for key, value in batch.items():
        if value.is_nested:
            items[key] = (
                str(value.layout).removeprefix("torch."),
                [serialize_single_tensor(t) for t in value.unbind()],
            )
        else:
            items[key] = serialize_single_tensor(value)
    device = str(batch.device) if batch.device is not None else None
    return tuple(batch.batch_size), device, items


def deserialize_tensordict(encoded: tuple[Any, str | None, Mapping[str, Any]]) -> TensorDict:
    """The TensorDict that `serialize_tensordict` encoded, on its original device."""
    batch_size, device, items = encoded
    tensors = {}
    for key, value in items.items():
        if len(value) == 2 and isinstance(value[1], list):
            layout, rows = value
            tensors[key] = torch.nested.as_nested_tensor(
                [deserialize_single_tensor(row) for row in rows], layout=getattr(torch, layout)
            )
        else:
            tensors[key] = deserialize_single_tensor(value)
    return TensorDict(tensors, batch_size=batch_size, device=device)


def to_tensordict(
    batch: TensorDict | None, non_tensor_batch: Mapping[str, np.ndarray], meta_info: Mapping[str, Any]
) -> TensorDict:
    """One TensorDict: tensors as they are, each non-tensor column as a `NonTensorStack` (one object per row, nested
    lists and dicts kept whole), each meta_info value as `NonTensorData`."""
    shared = set(batch.keys() if batch is not None else []) & set(non_tensor_batch)
    if shared:
        raise ValueError(f"keys {sorted(shared)} are both tensors and non-tensor columns; rename one side.")
    num_rows = batch.batch_size[0] if batch is not None else len(next(iter(non_tensor_batch.values()), []))
    fields: dict[str, Any] = dict(batch.items()) if batch is not None else {}
    for key, column in non_tensor_batch.items():
        fields[key] = NonTensorStack.from_list([NonTensorData(item) for item in column])
    output = TensorDict(fields, batch_size=[num_rows])
    for key, value in meta_info.items():
        output[key] = NonTensorData(value)
    return output


def from_tensordict(tensor_dict: TensorDict, meta_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The (batch, non_tensor_batch, meta_info) keyword arguments of a DataProto built from `to_tensordict`'s output."""
    tensors, non_tensors, meta = {}, {}, dict(meta_info or {})
    for key in tensor_dict.keys():  # noqa: SIM118 (iterating a TensorDict walks its rows)
        value = tensor_dict.get(key)
        if isinstance(value, NonTensorStack):
            non_tensors[key] = _object_column([item.data for item in value])
        elif isinstance(value, NonTensorData):
            meta[key] = value.data
        elif isinstance(value, torch.Tensor):
            tensors[key] = value
    num_rows = tensor_dict.batch_size[0] if tensor_dict.batch_dims else None
    batch = TensorDict(tensors, batch_size=[num_rows]) if tensors else None
    return {"batch": batch, "non_tensor_batch": non_tensors, "meta_info": meta}


def _object_column(values: list[Any]) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column
