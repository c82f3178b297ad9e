"""A TensorDict's keys and values: building one from columns and batch values, reading a key back as user code
wants it, taking a subset of keys, and merging or comparing two by key.

    td = get_tensordict({"input_ids": ids, "uid": ["a", "b"]}, non_tensor_dict={"global_steps": 3})
    get(td, "uid")                           # ["a", "b"]   (a NonTensorStack comes back as a list)
    get(td, "global_steps")                  # 3            (a NonTensorData comes back unwrapped)
    sampling = pop_keys(td, ["global_steps"])

A column is a tensor of shape (B, ...), a jagged nested tensor (`hyflow.utils.nested_tensors`), or a
`NonTensorStack` of B Python objects; a batch-level value is a `NonTensorData`. Mistakes raise `DataProtoError`,
naming the key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData, NonTensorStack

from hyflow.protocol.values import DataProtoError, MissingKeyError, same_value
from hyflow.utils.nested_tensors import nested_rows

__all__ = [
    "assert_tensordict_eq",
    "assign_non_tensor",
    "assign_non_tensor_data",
    "assign_non_tensor_stack",
    "get",
    "get_keys",
    "get_non_tensor_data",
    "get_tensordict",
    "list_of_dict_to_tensordict",
    "pop",
    "pop_keys",
    "union_tensor_dict",
    "unwrap_non_tensor_data",
]


# ---- non-tensor values ----
def _stack(values: Iterable[Any]) -> NonTensorStack:
    """One `NonTensorData` per row, so nested lists and dicts stay whole objects (not stacked further)."""
    return NonTensorStack.from_list([NonTensorData(value) for value in values])


def assign_non_tensor_data(tensor_dict: TensorDict, key: str, val: Any) -> None:
    """Store `val` as one batch-level value under `key`."""
    tensor_dict[key] = NonTensorData(val)


def assign_non_tensor_stack(tensor_dict: TensorDict, key: str, val: Sequence[Any]) -> None:
    """Store `val` (one object per row) as a column under `key`."""
    tensor_dict[key] = _stack(val)


def assign_non_tensor(tensor_dict: TensorDict, **kwargs: Any) -> TensorDict:
    """Store each keyword: a list becomes a column, an existing NonTensorData/Stack goes in as is, anything else
    is a batch-level value. A column whose length is not the batch size raises tensordict's RuntimeError."""
    for key, val in kwargs.items():
        if isinstance(val, NonTensorData | NonTensorStack):
            tensor_dict[key] = val
        elif isinstance(val, list):
            assign_non_tensor_stack(tensor_dict, key, val)
        else:
            assign_non_tensor_data(tensor_dict, key, val)
    return tensor_dict


def unwrap_non_tensor_data(data: Any) -> Any:
    """The value inside a `NonTensorData`; anything else unchanged."""
    return data.data if isinstance(data, NonTensorData) else data


def get_non_tensor_data(data: TensorDict, key: str, default: Any) -> Any:
    """`data[key]` unwrapped, or `default` when the key is absent."""
    return unwrap_non_tensor_data(data.get(key, default))


def _native(value: Any) -> Any:
    """A stored value as user code wants it: tensors as they are, a column as a list, a batch value unwrapped."""
    if isinstance(value, NonTensorStack):
        return value.tolist()
    return unwrap_non_tensor_data(value)


# ---- construction ----
def _num_rows(key: str, value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.size(0)
    if isinstance(value, NonTensorStack | list | tuple | np.ndarray):
        return len(value)
    raise DataProtoError(
        f"tensor_dict[{key!r}] is a {type(value).__name__}; a column must be a torch.Tensor, a list or a numpy "
        "array with one entry per row. Put batch-level values in non_tensor_dict."
    )


def _column(key: str, value: Any) -> torch.Tensor | NonTensorStack:
    if isinstance(value, torch.Tensor):
        if value.is_nested and value.layout != torch.jagged:
            raise DataProtoError(f"tensor_dict[{key!r}] is a strided nested tensor; build it with layout=torch.jagged.")
        return value
    if isinstance(value, NonTensorStack):
        return value
    if any(isinstance(item, torch.Tensor) for item in value):
        raise DataProtoError(
            f"tensor_dict[{key!r}] is a list holding torch.Tensors; stack them into one tensor, make a nested "
            "tensor (nested_tensor_from_tensor_list), or convert the rows to numpy arrays."
        )
    return _stack(value)


def get_tensordict(tensor_dict: dict[str, Any], non_tensor_dict: dict[str, Any] | None = None) -> TensorDict:
    """A TensorDict of the columns in `tensor_dict` (tensors, nested tensors, lists) and the batch-level values in
    `non_tensor_dict`. All columns must have the same number of rows; with no column the batch size is []."""
    non_tensor_dict = non_tensor_dict or {}
    rows = {key: _num_rows(key, value) for key, value in tensor_dict.items()}
    if len(set(rows.values())) > 1:
        raise DataProtoError(f"columns have different numbers of rows: {rows}; every column needs one per row.")
    shared = sorted(set(tensor_dict) & set(non_tensor_dict))
    if shared:
        raise DataProtoError(f"keys {shared} are both in tensor_dict and non_tensor_dict; rename one side.")
    fields: dict[str, Any] = {key: _column(key, value) for key, value in tensor_dict.items()}
    fields.update({key: NonTensorData(value) for key, value in non_tensor_dict.items()})
    batch_size = [next(iter(rows.values()))] if rows else []
    return TensorDict(fields, batch_size=batch_size)


def list_of_dict_to_tensordict(list_of_dicts: list[dict[str, Any]]) -> TensorDict:
    """One row per dict: equal-shape tensors are stacked, ragged ones nested (jagged), anything else a column."""
    if not list_of_dicts:
        raise DataProtoError("list_of_dict_to_tensordict needs at least one row.")
    fields: dict[str, Any] = {}
    for key in list_of_dicts[0]:
        values = [row[key] for row in list_of_dicts]
        if all(isinstance(value, torch.Tensor) for value in values):
            same_shape = all(value.shape == values[0].shape for value in values)
            fields[key] = (
                torch.stack(values) if same_shape else torch.nested.as_nested_tensor(values, layout=torch.jagged)
            )
        else:
            fields[key] = _stack(values)
    return TensorDict(fields, batch_size=[len(list_of_dicts)])


# ---- keys ----
def get(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """`tensordict[key]` as a tensor, a list (a column) or the plain value (a batch value); `default` if absent."""
    return _native(tensordict.get(key)) if key in tensordict else default


def pop(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """Remove `key` and return its value as `get` would; `default` if absent."""
    return _native(tensordict.pop(key)) if key in tensordict else default


def _subset(tensordict: TensorDict, keys: Iterable[str], remove: bool) -> TensorDict:
    keys = list(keys)
    missing = [key for key in keys if key not in tensordict]
    if missing:
        raise MissingKeyError(f"keys {missing} are not in the TensorDict; it has {sorted(tensordict.keys())}.")
    columns, batch_values = {}, {}
    for key in keys:
        value = tensordict.pop(key) if remove else tensordict.get(key)
        if isinstance(value, NonTensorData):
            batch_values[key] = value.data
        else:
            columns[key] = _native(value)
    output = get_tensordict(columns, batch_values)
    if not columns and tensordict.batch_size:
        output.batch_size = tensordict.batch_size
    return output


def get_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """A new TensorDict with only `keys` (KeyError naming any missing one)."""
    return _subset(tensordict, keys, remove=False)


def pop_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """Remove `keys` from `tensordict` and return them as a new TensorDict (KeyError naming any missing one)."""
    return _subset(tensordict, keys, remove=True)


# ---- merging and comparing ----
def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.is_nested != b.is_nested:
            return False
        if a.is_nested:
            rows_a, rows_b = nested_rows(a), nested_rows(b)
            return len(rows_a) == len(rows_b) and all(torch.equal(x, y) for x, y in zip(rows_a, rows_b, strict=True))
        return a.shape == b.shape and bool(torch.equal(a, b))
    return same_value(_native(a), _native(b))


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add `tensor_dict2`'s keys to `tensor_dict1` in place; a key both hold must hold equal values."""
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise DataProtoError(
            f"cannot union TensorDicts of batch sizes {list(tensor_dict1.batch_size)} and "
            f"{list(tensor_dict2.batch_size)}; both must have the same rows."
        )
    for key in tensor_dict2.keys():  # noqa: SIM118 (iterating a TensorDict walks its rows)
        if key not in tensor_dict1:
            tensor_dict1[key] = tensor_dict2.get(key)
        elif not _equal(tensor_dict1.get(key), tensor_dict2.get(key)):
            raise DataProtoError(
                f"union conflict on {key!r}: `{key}` in tensor_dict1 and tensor_dict2 are not the same object "
                "(both hold the key, with different values). Pop or rename it on one side before the union."
            )
    return tensor_dict1


def assert_tensordict_eq(tensordict1: TensorDict, tensordict2: TensorDict) -> None:
    """Raise (an AssertionError) naming the first key where the two differ: key sets, types or values."""
    keys1, keys2 = set(tensordict1.keys()), set(tensordict2.keys())
    if keys1 != keys2:
        raise DataProtoError(
            f"the key sets differ: only in the first {keys1 - keys2}, only in the second {keys2 - keys1}."
        )
    for key in tensordict1.keys():  # noqa: SIM118 (iterating a TensorDict walks its rows)
        value1, value2 = tensordict1.get(key), tensordict2.get(key)
        if type(value1) is not type(value2):
            raise DataProtoError(
                f"{key!r} is a {type(value1).__name__} in one and a {type(value2).__name__} in the other."
            )
        if not _equal(value1, value2):
            raise DataProtoError(f"{key!r} holds different values: {value1!r} vs {value2!r}.")
