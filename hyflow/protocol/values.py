"""Row values of a `DataProto`: conversion to object arrays, equality for `union`, row indexing, key checks.

Private helpers of `hyflow.protocol.dataproto`, kept apart so that file holds only the `DataProto` class itself;
`DataProtoError` and `Index` (what `DataProto[...]` takes) are public, re-exported by `hyflow.protocol`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from hyflow.fields import METRICS, TIMING, describe

# What `DataProto[...]` takes: a row (int), a slice, a boolean mask or integer row indices.
Index = int | slice | torch.Tensor | np.ndarray | Sequence[int] | Sequence[bool]


class DataProtoError(ValueError, AssertionError):
    """A DataProto operation given data that does not fit it (rows that do not divide, keys that conflict, ...).

    It is a ValueError, like every hyflow user error, and also an AssertionError, which is what verl raises for the
    same mistakes: code ported from verl that catches AssertionError keeps working.
    """


class MissingKeyError(KeyError):
    """A KeyError whose message prints as written (KeyError would wrap it in quotes)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def compact_rows(batch: TensorDict) -> TensorDict:
    """Clone tensors that are views into a larger storage, so pickling a slice does not ship the whole batch."""

    def compact(tensor: torch.Tensor) -> torch.Tensor:
        needed = tensor.numel() * tensor.element_size()
        return tensor.clone() if tensor.untyped_storage().nbytes() > needed else tensor

    return batch.apply(compact)


def to_object_array(key: str, value: Any) -> np.ndarray:
    """Make `value` a numpy object array whose first dimension is the row axis.

    A list of equal-length lists or of dicts stays 1-D (one object per row): numpy would otherwise broadcast it.
    """
    if isinstance(value, np.ndarray):
        return value if value.dtype == object else value.astype(object)
    if isinstance(value, (list, tuple)):
        array = np.empty(len(value), dtype=object)
        for i, item in enumerate(value):
            array[i] = item
        return array
    raise TypeError(
        f"non_tensor_batch['{key}'] is a {type(value).__name__}; it must be a numpy array or a list with one "
        f"entry per row. Wrap it: np.array(values, dtype=object)."
    )


def same_value(a: Any, b: Any, _seen: set[tuple[int, int]] | None = None) -> bool:
    """Equality that works for tensors, numpy arrays, dicts and lists of them (never raises on ambiguity).

    NaNs in the same place count as equal (a copied float column equals its original), and self-referencing
    object arrays compare by structure instead of recursing forever.
    """
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        b = b.to(a.device)
        return torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    seen = set() if _seen is None else _seen
    pair = (id(a), id(b))
    if pair in seen:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        if a_arr.shape != b_arr.shape:
            return False
        if a_arr.dtype != object and b_arr.dtype != object:
            return bool(np.array_equal(a_arr, b_arr, equal_nan=a_arr.dtype.kind in "fc" and b_arr.dtype.kind in "fc"))
        seen.add(pair)
        return all(same_value(x, y, seen) for x, y in zip(a_arr.ravel(), b_arr.ravel()))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        seen.add(pair)
        return a.keys() == b.keys() and all(same_value(a[k], b[k], seen) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        seen.add(pair)
        return len(a) == len(b) and all(same_value(x, y, seen) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return False


def check_union(where: str, mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> None:
    """Raise a DataProtoError naming the first key that both hold with different values."""
    for key in theirs:
        if key in mine and not same_value(mine[key], theirs[key]):
            raise DataProtoError(
                f"union conflict on {where}['{key}']: `{key}` in tensor_dict1 and tensor_dict2 are not the same "
                f"object (both hold the key, with different values). Pop or rename it on one side before the union."
            )


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add `tensor_dict2`'s keys to `tensor_dict1` in place (verl's helper); shared keys must hold equal tensors."""
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise DataProtoError(
            f"cannot union TensorDicts of batch sizes {list(tensor_dict1.batch_size)} and "
            f"{list(tensor_dict2.batch_size)}; both must have the same rows."
        )
    check_union("batch", dict(tensor_dict1.items()), dict(tensor_dict2.items()))
    present = set(tensor_dict1.keys())
    tensor_dict1.update({k: v for k, v in tensor_dict2.items() if k not in present})
    return tensor_dict1


def union_numpy_dict(dict1: dict[str, np.ndarray], dict2: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add `dict2`'s arrays to `dict1` in place (verl's helper); shared keys must hold equal values (NaN == NaN)."""
    check_union("non_tensor_batch", dict1, dict2)
    dict1.update({k: v for k, v in dict2.items() if k not in dict1})
    return dict1


def check_concat_parts(parts: Sequence[tuple[TensorDict | None, Mapping[str, np.ndarray]]]) -> None:
    """Raise a DataProtoError unless every (batch, non_tensor_batch) part has part 0's keys and per-row shapes."""
    first_batch, first_columns = parts[0]
    first_batch_keys = set(first_batch.keys()) if first_batch is not None else set()
    for i, (part_batch, part_columns) in enumerate(parts[1:], start=1):
        part_batch_keys = set(part_batch.keys()) if part_batch is not None else set()
        for where, a, b in [
            ("batch", first_batch_keys, part_batch_keys),
            ("non_tensor_batch", set(first_columns), set(part_columns)),
        ]:
            if a != b:
                raise DataProtoError(
                    f"cannot concat: part {i} has different {where} keys than part 0 (only in part 0: "
                    f"{sorted(a - b)}, only in part {i}: {sorted(b - a)}). Select the same keys on every part."
                )
        if part_batch is not None:
            for key in first_batch_keys:
                if part_batch[key].shape[1:] != first_batch[key].shape[1:]:
                    raise DataProtoError(
                        f"cannot concat: batch['{key}'] has per-row shape {list(part_batch[key].shape[1:])} in "
                        f"part {i} but {list(first_batch[key].shape[1:])} in part 0. Pad to the same length."
                    )


def merge_meta_info(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The meta_info of concatenated parts (one per worker, say).

    `metrics` are gathered, never dropped: each part's `metrics` (a dict, or a list of dicts) is flattened into one
    dict of lists, in part order (as verl does). `timing` keeps each phase's slowest part, the time the controller
    waited. Every other key is taken once; parts that hold it must agree.
    """
    merged: dict[str, Any] = {}
    metrics: dict[str, list[Any]] = {}
    has_metrics = False
    for part in parts:
        for key, value in part.items():
            if key == TIMING and key in merged:
                slowest = dict(merged[key])
                for name, seconds in value.items():
                    slowest[name] = max(slowest.get(name, seconds), seconds)
                merged[key] = slowest
            elif key == METRICS:
                has_metrics = True
                for record in value if isinstance(value, (list, tuple)) else [value]:
                    for name, number in record.items():
                        metrics.setdefault(name, []).append(number)
            elif key not in merged:
                merged[key] = value
            elif not same_value(merged[key], value):
                raise DataProtoError(
                    f"Conflicting values for meta_info key '{key}' across the parts of a concat: {merged[key]!r:.60} "
                    f"vs {value!r:.60}. Parts must agree on batch-wide values; pop the key before concat."
                )
    if has_metrics:
        merged["metrics"] = metrics
    return merged


def row_index(index: torch.Tensor | np.ndarray | Sequence, length: int) -> np.ndarray:
    """Turn a bool mask or integer index (tensor, array or list) into an int64 numpy array of rows."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    array = np.asarray(index)
    if array.ndim != 1:
        raise IndexError(f"DataProto index must be 1-D, got shape {array.shape}.")
    if array.dtype == bool:
        if len(array) != length:
            raise IndexError(f"boolean index has length {len(array)} but the DataProto has {length} rows.")
        return np.nonzero(array)[0].astype(np.int64)
    if array.size == 0:
        return array.astype(np.int64)
    if not np.issubdtype(array.dtype, np.integer):
        raise IndexError(f"DataProto index must hold integers or booleans, got dtype {array.dtype}.")
    if array.max() >= length or array.min() < -length:
        raise IndexError(f"DataProto index out of range: rows must lie in [-{length}, {length}), got {array}.")
    return array.astype(np.int64)


def check_keys(where: str, wanted: Iterable[str], present: Iterable[str]) -> list[str]:
    """Return `wanted` as a list, or raise naming the missing keys, the available ones and what each one is."""
    wanted, present = list(wanted), list(present)
    missing = [key for key in wanted if key not in present]
    if missing:
        details = "; ".join(describe(key) for key in missing)
        raise MissingKeyError(
            f"DataProto.{where} has no key {missing} (available: {sorted(present)}). Wanted: {details}"
        )
    return wanted
