"""A `TensorDict` as a whole batch: tensors, per-row Python objects and batch-level values in one container.

verl's `verl.utils.tensordict_utils` (imported as `tu`) under the same names, for worker code ported from verl
that passes raw TensorDicts instead of DataProtos. The conventions:

- a tensor of shape (B, ...) is a column; a jagged nested tensor (B, *ragged*, ...) is a column of
  variable-length rows (packed sequences; `.offsets()` are the cu_seqlens);
- a Python list of B objects (strings, lists, dicts, numpy arrays) is a `NonTensorStack` column;
- a batch-level value (sampling params, `global_steps`) is `NonTensorData`, kept as is by row operations.

    td = get_tensordict({"input_ids": ids, "uid": ["a", "b"]}, non_tensor_dict={"global_steps": 3})
    get(td, "uid")                           # ["a", "b"]   (a NonTensorStack comes back as a list)
    first, second = chunk_tensordict(td, 2)  # nested tensors keep their ragged dimension

Mistakes raise `DataProtoError` (a ValueError that is also the AssertionError verl raises), naming the key.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData, NonTensorStack

from hyflow.protocol_values import DataProtoError, MissingKeyError, same_value

logger = logging.getLogger(__name__)

__all__ = [
    "assert_tensordict_eq",
    "assign_non_tensor",
    "assign_non_tensor_data",
    "assign_non_tensor_stack",
    "chunk_tensordict",
    "concat_nested_tensors",
    "concat_tensordict",
    "contiguous",
    "get",
    "get_keys",
    "get_non_tensor_data",
    "get_tensordict",
    "index_select_tensor_dict",
    "list_of_dict_to_tensordict",
    "make_iterator",
    "maybe_fix_3d_position_ids",
    "nested_tensor_from_tensor_list",
    "pad_to_divisor",
    "pop",
    "pop_keys",
    "union_tensor_dict",
    "unpad",
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


# ---- nested (jagged) tensors ----
def _ragged_idx(tensor: torch.Tensor) -> int:
    return getattr(tensor, "_ragged_idx", tensor.dim() - 1)


def nested_tensor_from_tensor_list(tensors: Sequence[torch.Tensor], ragged_idx: int | None = None) -> torch.Tensor:
    """A jagged nested tensor of the rows `tensors`, ragged along row dimension `ragged_idx - 1`.

    `ragged_idx` counts the batch dimension (1 = the rows' first dimension); default: the rows' last dimension,
    e.g. (4, T_i) M-RoPE position ids -> (B, 4, *T*). The rows must agree in every other dimension.
    """
    if not tensors:
        raise DataProtoError("nested_tensor_from_tensor_list needs at least one tensor.")
    row_dims = tensors[0].dim()
    ragged_idx = row_dims if ragged_idx is None else ragged_idx
    if not 1 <= ragged_idx <= row_dims:
        raise DataProtoError(f"ragged_idx={ragged_idx} must be in [1, {row_dims}] for rows of {row_dims} dimensions.")
    if row_dims == 1:
        return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)
    cat_dim = ragged_idx - 1
    values = torch.cat(list(tensors), dim=cat_dim)
    lengths = torch.tensor([t.shape[cat_dim] for t in tensors], dtype=torch.long, device=values.device)
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    nested = torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets)
    nested._ragged_idx = ragged_idx  # nested_tensor_from_jagged assumes the ragged dim is the values' first
    return nested


def _rows(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The rows of a jagged nested tensor (unbind, with a padded fallback where unbind fails for 3-D ones)."""
    try:
        return list(tensor.unbind(0))
    except RuntimeError:  # torch's unbind of 3-D jagged tensors splits the wrong dim (pytorch#153238)
        padded = tensor.to_padded_tensor(0)
        lengths = tensor.offsets().diff().tolist()
        dim = _ragged_idx(tensor) - 1
        return [padded[i].narrow(dim, 0, length) for i, length in enumerate(lengths)]


def _nested_like(rows: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    return nested_tensor_from_tensor_list(rows, ragged_idx=_ragged_idx(like))


def concat_nested_tensors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The rows of several jagged nested tensors, in order, as one nested tensor."""
    for tensor in tensors:
        if not (tensor.is_nested and tensor.is_contiguous() and tensor.dim() >= 2):
            raise DataProtoError(f"concat_nested_tensors takes contiguous jagged tensors; got shape {tensor.shape}.")
    return _nested_like([row for tensor in tensors for row in _rows(tensor)], tensors[0])


def maybe_fix_3d_position_ids(data: TensorDict) -> None:
    """Restore the ragged dimension of 3-D nested `position_ids` (M-RoPE), which a pickle round trip loses."""
    position_ids = data.get("position_ids", None)
    if isinstance(position_ids, torch.Tensor) and position_ids.is_nested and position_ids.dim() == 3:
        position_ids._ragged_idx = 2


# ---- row operations ----
def _nested_keys(td: TensorDict) -> set[str]:
    return {key for key, value in td.items() if isinstance(value, torch.Tensor) and value.is_nested}


def _without(td: TensorDict, keys: set[str]) -> TensorDict:
    return TensorDict({k: v for k, v in td.items() if k not in keys}, batch_size=td.batch_size, device=td.device)


def index_select_tensor_dict(batch: TensorDict | None, indices: torch.Tensor | Sequence[int]) -> TensorDict | None:
    """The rows `indices` (1-D) of `batch`, nested tensors and columns included; batch values kept."""
    indices = torch.as_tensor(indices)
    if indices.dim() != 1:
        raise DataProtoError(f"indices must be 1-D; got shape {list(indices.shape)}.")
    if batch is None:
        return None
    fields = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.is_nested:
            rows = _rows(value)
            fields[key] = _nested_like([rows[i] for i in indices.tolist()], value)
        elif isinstance(value, torch.Tensor) or value.shape:
            fields[key] = value[indices]
        else:  # NonTensorData: a batch-level value
            fields[key] = value
    return TensorDict(fields, batch_size=[indices.shape[0]])


def concat_tensordict(data: Sequence[TensorDict]) -> TensorDict:
    """The rows of all parts in order; nested tensors are concatenated row-wise, batch values come from part 0.
    Parts without a batch dimension (batch values only) give part 0."""
    if not data:
        raise DataProtoError("concat_tensordict needs at least one TensorDict.")
    if len(data[0].batch_size) == 0:
        return data[0]
    nested = _nested_keys(data[0])
    for i, part in enumerate(data):
        if _nested_keys(part) != nested:
            raise DataProtoError(f"part {i} has nested tensors {sorted(_nested_keys(part))}, part 0 {sorted(nested)}.")
    batch_values = {k: v for k, v in data[0].items() if isinstance(v, NonTensorData)}
    output = TensorDict.cat([_without(part, nested | set(batch_values)) for part in data], dim=0)
    output.update(batch_values)
    for key in nested:
        output[key] = concat_nested_tensors([part[key] for part in data])
    return output


def chunk_tensordict(td: TensorDict, chunks: int) -> list[TensorDict]:
    """`chunks` equal parts of `td` (its length must divide), nested tensors keeping their ragged dimension."""
    if len(td) % chunks != 0:
        raise DataProtoError(f"cannot chunk {len(td)} rows into {chunks} equal parts; pad first (pad_to_divisor).")
    size = len(td) // chunks
    nested = _nested_keys(td)
    parts = list(_without(td, nested).chunk(chunks))
    for key in nested:
        rows = _rows(td[key])
        for i, part in enumerate(parts):
            part[key] = _nested_like(rows[i * size : (i + 1) * size], td[key])
    return parts


def make_iterator(
    tensordict: TensorDict,
    mini_batch_size: int,
    epochs: int,
    seed: int | None = None,
    dataloader_kwargs: dict[str, Any] | None = None,
) -> Iterator[TensorDict]:
    """`epochs` passes over `tensordict` in mini-batches of `mini_batch_size` rows, through a torch DataLoader of
    row indices (`dataloader_kwargs`, e.g. shuffle=True); the same `seed`, the same batches."""
    if len(tensordict) % mini_batch_size != 0:
        raise DataProtoError(f"{len(tensordict)} rows do not divide into mini-batches of {mini_batch_size}.")
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(
        torch.arange(len(tensordict)),
        batch_size=mini_batch_size,
        collate_fn=torch.stack,
        generator=generator,
        **(dataloader_kwargs or {}),
    )
    return (index_select_tensor_dict(tensordict, indices) for _ in range(epochs) for indices in loader)


def pad_to_divisor(data: TensorDict, size_divisor: int) -> tuple[TensorDict, int]:
    """`data` with its first rows repeated at the end until its length divides `size_divisor`; and the pad size."""
    if len(data) == 0:
        logger.warning("pad_to_divisor: the TensorDict has no rows; nothing to pad.")
    pad_size = -len(data) % size_divisor
    if pad_size == 0 or len(data) == 0:
        return data, 0
    rows = torch.arange(len(data) + pad_size) % len(data)
    return torch.cat([data, data[rows[len(data) :]]]), pad_size


def unpad(data: TensorDict, pad_size: int) -> TensorDict:
    """`data` without its last `pad_size` rows (what `pad_to_divisor` added)."""
    return data[:-pad_size] if pad_size else data


def contiguous(data: TensorDict) -> TensorDict:
    """A new TensorDict whose tensors are contiguous (so it can be consolidated), columns and batch values kept."""
    fields = {}
    for key in data.keys():  # noqa: SIM118 (iterating a TensorDict walks its rows)
        value = data.get(key)
        fields[key] = value.contiguous() if isinstance(value, torch.Tensor) else value
    return TensorDict(fields, batch_size=data.batch_size)


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


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.is_nested != b.is_nested:
            return False
        if a.is_nested:
            rows_a, rows_b = _rows(a), _rows(b)
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
