"""Row values of a `DataProto`: conversion to object arrays, equality for `union`, row indexing, key checks.

Private helpers of `hyflow.protocol`, kept apart so that file holds only the `DataProto` class itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from hyflow.fields import describe


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


def same_value(a: Any, b: Any) -> bool:
    """Equality that works for tensors, numpy arrays, dicts and lists of them (never raises on ambiguity)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b.to(a.device))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        if a_arr.shape != b_arr.shape:
            return False
        return all(same_value(x, y) for x, y in zip(a_arr.ravel(), b_arr.ravel()))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return False


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
