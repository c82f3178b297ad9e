"""DataProto: the batch that travels between the single controller and the worker groups.

A `DataProto` holds three things for B rows:

- `batch`: a `tensordict.TensorDict` with `batch_size=[B]`; every tensor has B as its first dimension.
- `non_tensor_batch`: a dict of numpy object arrays of length B (strings, dicts, lists: one per row).
- `meta_info`: a dict of values for the whole batch (temperature, metrics, ...).

Field names are listed, with shapes and meanings, in `hyflow.fields`. Worker groups split a `DataProto` into
per-rank shards with `chunk`, and put the results back together with `concat`; `pad_to_divisor` / `unpad` make a
batch divisible by the data-parallel size. Import it from the package, `from hyflow.protocol import DataProto`;
the package's other files are listed in `hyflow/protocol/__init__.py`.

Example::

    data = DataProto.from_single_dict({"input_ids": ids, "uid": np.array(["a", "b"], dtype=object)})
    shards = data.chunk(2)              # one per rank
    out = DataProto.concat(shards)      # back to one batch
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from hyflow.protocol.values import (
    DataProtoError,
    Index,
    check_concat_parts,
    check_keys,
    check_union,
    compact_rows,
    merge_meta_info,
    row_index,
    to_object_array,
)
from hyflow.protocol.verl_methods import VerlDataProtoMethods

__all__ = ["AUTO_PADDING_KEY", "DataProto", "DataProtoConfig", "pad_dataproto_to_divisor", "unpad_dataproto"]

# meta_info flag (verl's name) that lets `chunk` cut rows that do not divide into near-equal parts.
AUTO_PADDING_KEY = "_verl_auto_padding"


class DataProtoConfig:
    """Process-wide DataProto settings, as verl's: `DataProtoConfig.auto_padding = True` turns auto padding on for
    every DataProto of this process (not only those built with `auto_padding=True`)."""

    auto_padding: bool = False


@dataclass(eq=False)
class DataProto(VerlDataProtoMethods):
    """A batch of B rows: tensors in `batch`, per-row Python objects in `non_tensor_batch`, and `meta_info`."""

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batch is not None and not isinstance(self.batch, TensorDict):
            raise TypeError(
                f"DataProto.batch must be a tensordict.TensorDict or None, got {type(self.batch).__name__}. "
                f"Build from plain tensors with DataProto.from_dict(tensors) or DataProto.from_single_dict(data)."
            )
        self.non_tensor_batch = {k: to_object_array(k, v) for k, v in (self.non_tensor_batch or {}).items()}
        self.meta_info = dict(self.meta_info or {})
        self.check_consistency()

    # ---- construction ----
    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, np.ndarray | list] | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build from a dict of tensors (all sharing dim 0), a dict of per-row arrays, and meta_info.

        `auto_padding=True` lets `chunk` cut a row count that does not divide (verl's flag, kept in meta_info).
        """
        if num_batch_dims != 1:
            raise DataProtoError(
                f"num_batch_dims={num_batch_dims}: a DataProto has exactly one batch dimension (rows). Keep extra "
                f"dimensions inside each tensor, or fold rows into groups with fold_batch_dim."
            )
        tensors = dict(tensors or {})
        batch = None
        if tensors:
            lengths = {}
            for key, value in tensors.items():
                if not isinstance(value, torch.Tensor) or value.dim() == 0:
                    raise DataProtoError(
                        f"tensor '{key}' must be a torch.Tensor with a row dimension, got {value!r:.80}."
                    )
                lengths[key] = value.shape[0]
            first_key = next(iter(lengths))
            for key, length in lengths.items():
                if length != lengths[first_key]:
                    raise DataProtoError(
                        f"tensor '{key}' has {length} rows but '{first_key}' has {lengths[first_key]}; every field "
                        f"of a DataProto must have the same first dimension."
                    )
            batch = TensorDict(tensors, batch_size=[lengths[first_key]])
        meta_info = dict(meta_info or {})
        if auto_padding:
            meta_info[AUTO_PADDING_KEY] = True
        return cls(batch=batch, non_tensor_batch=dict(non_tensors or {}), meta_info=meta_info)

    @classmethod
    def from_single_dict(
        cls,
        data: Mapping[str, torch.Tensor | np.ndarray | list],
        meta_info: dict[str, Any] | None = None,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build from one dict: torch tensors go to `batch`, numpy arrays and lists to `non_tensor_batch`."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, (np.ndarray, list, tuple)):
                non_tensors[key] = value
            else:
                raise DataProtoError(
                    f"'{key}' is a {type(value).__name__}; from_single_dict takes torch tensors and numpy arrays "
                    f"(or lists) with one entry per row. Put batch-wide values in meta_info instead."
                )
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    def check_consistency(self) -> None:
        """Check that `batch` is 1-D and every non-tensor array has the same number of rows as the batch."""
        if self.batch is not None and self.batch.batch_dims != 1:
            raise DataProtoError(
                f"DataProto.batch must have one batch dimension (batch_size=[B]), got batch_size="
                f"{list(self.batch.batch_size)}. Build it with TensorDict(tensors, batch_size=[B])."
            )
        ref_key, ref_len = ("batch", self.batch.batch_size[0]) if self.batch is not None else (None, None)
        for key, array in self.non_tensor_batch.items():
            if array.ndim == 0:
                raise DataProtoError(f"non_tensor_batch['{key}'] is a 0-d array; it needs one entry per row.")
            if ref_key is None:
                ref_key, ref_len = f"non_tensor_batch['{key}']", len(array)
            elif len(array) != ref_len:
                raise DataProtoError(
                    f"non_tensor_batch['{key}'] has {len(array)} rows but {ref_key} has {ref_len}; every field of "
                    f"a DataProto must have the same first dimension."
                )

    # ---- size and indexing ----
    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for array in self.non_tensor_batch.values():
            return len(array)
        return 0

    def __getitem__(self, index: Index) -> DataProto:
        """Rows by int (a 1-row DataProto), slice, bool mask or integer index (tensor, numpy array or list)."""
        length = len(self)
        if isinstance(index, (int, np.integer)):
            if not -length <= index < length:
                raise IndexError(f"row {index} is out of range for a DataProto of {length} rows.")
            start = int(index) % length
            index = slice(start, start + 1)
        if isinstance(index, slice):
            return self._take(index, index)
        rows = row_index(index, length)
        return self._take(torch.from_numpy(rows), rows)

    def _take(self, tensor_index: slice | torch.Tensor, array_index: slice | np.ndarray) -> DataProto:
        batch = self.batch[tensor_index] if self.batch is not None else None
        non_tensors = {key: array[array_index] for key, array in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(self.meta_info))

    # ---- selecting and merging keys ----
    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto with only the named keys (None keeps all of that kind); `deepcopy` copies the values."""
        batch = None
        if self.batch is not None:
            present = list(self.batch.keys())
            keys = check_keys("batch", batch_keys if batch_keys is not None else present, present)
            batch = self.batch.select(*keys)
        elif batch_keys:
            check_keys("batch", batch_keys, [])
        nt_keys = non_tensor_batch_keys if non_tensor_batch_keys is not None else self.non_tensor_batch
        nt_keys = check_keys("non_tensor_batch", nt_keys, self.non_tensor_batch)
        meta_keys = meta_info_keys if meta_info_keys is not None else self.meta_info
        meta_keys = check_keys("meta_info", meta_keys, self.meta_info)
        non_tensors = {key: self.non_tensor_batch[key] for key in nt_keys}
        meta_info = {key: self.meta_info[key] for key in meta_keys}
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensors, meta_info = copy.deepcopy(non_tensors), copy.deepcopy(meta_info)
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    def pop(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
    ) -> DataProto:
        """Remove the named keys from this DataProto and return them as a new one (None pops nothing)."""
        batch_keys = check_keys("batch", batch_keys or [], self.batch.keys() if self.batch is not None else [])
        nt_keys = check_keys("non_tensor_batch", non_tensor_batch_keys or [], self.non_tensor_batch)
        meta_keys = check_keys("meta_info", meta_info_keys or [], self.meta_info)
        batch = None
        if batch_keys:
            batch = TensorDict({key: self.batch.pop(key) for key in batch_keys}, batch_size=self.batch.batch_size)
        non_tensors = {key: self.non_tensor_batch.pop(key) for key in nt_keys}
        meta_info = {key: self.meta_info.pop(key) for key in meta_keys}
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    def union(self, other: DataProto) -> DataProto:
        """Merge `other`'s keys into this DataProto in place and return it (verl semantics: `b = b.union(o)`).

        A key present in both must hold equal values; otherwise nothing is merged and a ValueError names the key.
        """
        if self._has_rows() and other._has_rows() and len(self) != len(other):
            raise DataProtoError(
                f"cannot union DataProtos of {len(self)} and {len(other)} rows; both must have the same rows."
            )
        check_union(
            "batch",
            dict(self.batch.items()) if self.batch is not None else {},
            dict(other.batch.items()) if other.batch is not None else {},
        )
        check_union("non_tensor_batch", self.non_tensor_batch, other.non_tensor_batch)
        check_union("meta_info", self.meta_info, other.meta_info)
        if other.batch is not None:
            if self.batch is None:
                self.batch = other.batch
            else:
                present = set(self.batch.keys())
                self.batch.update({k: v for k, v in other.batch.items() if k not in present})
        for mine, theirs in [(self.non_tensor_batch, other.non_tensor_batch), (self.meta_info, other.meta_info)]:
            mine.update({k: v for k, v in theirs.items() if k not in mine})
        return self

    def _has_rows(self) -> bool:
        """Whether any field fixes the row count (a meta-only DataProto unions with any batch)."""
        return self.batch is not None or bool(self.non_tensor_batch)

    def keys(self) -> list[str]:
        """All batch and non-tensor keys (not meta_info), batch keys first."""
        batch_keys = list(self.batch.keys()) if self.batch is not None else []
        return batch_keys + list(self.non_tensor_batch)

    # ---- splitting and joining rows ----
    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Join DataProtos row-wise. All must have the same keys.

        meta_info is merged: every part's `metrics` are gathered into one dict of lists, `timing` keeps each
        phase's slowest part, and any other key that several parts hold must have the same value in each.
        """
        if not data:
            raise DataProtoError("DataProto.concat got an empty list; pass at least one DataProto.")
        first = data[0]
        check_concat_parts([(part.batch, part.non_tensor_batch) for part in data])
        batches = [part.batch for part in data if part.batch is not None]
        batch = torch.cat(batches, dim=0) if len(batches) == len(data) else None
        non_tensors = {
            key: np.concatenate([part.non_tensor_batch[key] for part in data]) for key in first.non_tensor_batch
        }
        meta_info = merge_meta_info([part.meta_info for part in data])
        return type(first)(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    def split(self, split_size: int) -> list[DataProto]:
        """Parts of `split_size` rows each; the last part is shorter when the rows do not divide."""
        if not isinstance(split_size, int) or split_size < 1:
            raise DataProtoError(f"split_size must be a positive int, got {split_size!r}.")
        return [self[start : start + split_size] for start in range(0, len(self), split_size)]

    def chunk(self, chunks: int) -> list[DataProto]:
        """`chunks` equal parts. The rows must divide by `chunks` (pad first with `pad_to_divisor(chunks)`) unless
        auto padding is on (`from_dict(..., auto_padding=True)`): then the first parts get one row more."""
        if not isinstance(chunks, int) or chunks < 1:
            raise DataProtoError(f"chunks must be a positive int, got {chunks!r}.")
        if self.is_padding_enabled():
            bounds = np.cumsum([0] + [len(self) // chunks + (i < len(self) % chunks) for i in range(chunks)])
            return [self[int(bounds[i]) : int(bounds[i + 1])] for i in range(chunks)]
        if len(self) % chunks != 0:
            raise DataProtoError(
                f"cannot chunk a DataProto of {len(self)} rows into {chunks} equal parts ({len(self)} % {chunks} = "
                f"{len(self) % chunks}). Pad it first: padded, pad_size = data.pad_to_divisor({chunks}), and "
                f"unpad the result with unpad(pad_size)."
            )
        size = len(self) // chunks
        return [self[i * size : (i + 1) * size] for i in range(chunks)]

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Each row `repeat_times` times: interleaved (a, a, b, b) or tiled (a, b, a, b)."""
        if not isinstance(repeat_times, int) or repeat_times < 1:
            raise DataProtoError(f"repeat_times must be a positive int, got {repeat_times!r}.")
        rows = np.arange(len(self), dtype=np.int64)
        rows = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return self._take(torch.from_numpy(rows), rows)

    def is_padding_enabled(self) -> bool:
        """Whether `chunk` may cut uneven parts (meta_info's auto-padding flag, or `DataProtoConfig.auto_padding`)."""
        return bool(self.meta_info.get(AUTO_PADDING_KEY, False)) or DataProtoConfig.auto_padding

    def pad_to_divisor(self, divisor: int) -> tuple[DataProto, int]:
        """Append copies of the first rows (cycling) until the rows divide by `divisor`; return (padded, pad_size)."""
        if not isinstance(divisor, int) or divisor < 1:
            raise DataProtoError(f"divisor must be a positive int, got {divisor!r}.")
        pad_size = -len(self) % divisor
        if pad_size == 0:
            return self, 0
        rows = np.arange(pad_size, dtype=np.int64) % len(self)
        return DataProto.concat([self, self._take(torch.from_numpy(rows), rows)]), pad_size

    def unpad(self, pad_size: int) -> DataProto:
        """Drop the last `pad_size` rows added by `pad_to_divisor`."""
        if not 0 <= pad_size <= len(self):
            raise DataProtoError(f"pad_size must lie in [0, {len(self)}] (the number of rows), got {pad_size}.")
        return self if pad_size == 0 else self[: len(self) - pad_size]

    # ---- devices, pickling and printing ----
    def to(self, device: str | torch.device) -> DataProto:
        """Move the tensors to `device` (in place, like verl) and return self."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.batch is not None:
            state["batch"] = compact_rows(self.batch)
        return state

    def __repr__(self) -> str:
        tensors = []
        if self.batch is not None:
            for key, value in self.batch.items():
                dtype = str(value.dtype).removeprefix("torch.")
                tensors.append(f"{key}: {dtype}{list(value.shape)}")
        non_tensors = [f"{key}: {array.dtype}{list(array.shape)}" for key, array in self.non_tensor_batch.items()]
        return (
            f"DataProto(len={len(self)}, batch={{{', '.join(tensors)}}}, "
            f"non_tensor_batch={{{', '.join(non_tensors)}}}, meta_info_keys={list(self.meta_info)})"
        )


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """`data.pad_to_divisor(size_divisor)`: pad with copies of the first rows so len divides by `size_divisor`."""
    return data.pad_to_divisor(size_divisor)


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """`data.unpad(pad_size)`: drop the last `pad_size` rows."""
    return data.unpad(pad_size)
