"""verl's DataProto methods beyond hyflow's core, so code ported from verl runs unchanged.

`DataProto` (hyflow/protocol/dataproto.py) inherits `VerlDataProtoMethods`: mini-batch iteration, per-row repeats,
reordering, column chunks, padding, renaming, TensorDict and file round trips. hyflow's own code uses the core
methods of dataproto.py; these are kept here, under verl's names and signatures, for users' code. Also verl's module
functions `fold_batch_dim` / `unfold_batch_dim`:

    folded = fold_batch_dim(data, new_batch_size=3)     # 6 rows -> 3 rows of 2 (tensors [3, 2, ...])
    data = unfold_batch_dim(folded, batch_dims=2)       # back to 6 rows
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import numpy as np
import torch
from tensordict import TensorDict

from hyflow.protocol import tensordict_io
from hyflow.protocol.values import DataProtoError, Index, check_keys

__all__ = ["VerlDataProtoMethods", "fold_batch_dim", "unfold_batch_dim"]

# A DataProto, named by the class it inherits from here: dataproto.py imports this module, so this one does not
# import dataproto.py back (methods say `Self`).
DataProtoT = TypeVar("DataProtoT", bound="VerlDataProtoMethods")


class VerlDataProtoMethods:
    """Mixed into `DataProto`; every method works through the core API (indexing, `_take`, `concat`)."""

    def select_idxs(self, idxs: Index) -> Self:
        """verl's name for `self[idxs]` (integer or boolean index)."""
        return self[idxs]

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> Self:
        """verl's name for `self[start:end:step]`."""
        return self[start:end:step]

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """Put the rows in the order `indices` gives, in place (meta_info unchanged)."""
        reordered = self[indices]
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def sample_level_repeat(self, repeat_times: Sequence[int] | torch.Tensor | np.ndarray) -> Self:
        """Row i repeated `repeat_times[i]` times, rows kept in order (a, a, a, b, c, c for [3, 1, 2])."""
        rows = repeat_rows(repeat_times, len(self))
        return self._take(torch.from_numpy(rows), rows)

    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None
    ) -> Iterator[Self]:
        """`epochs` shuffled passes in mini-batches of `mini_batch_size` rows; the same `seed`, the same batches.
        (`dataloader_kwargs` is accepted for verl's signature; only its `shuffle=False` is honoured.)"""
        if (dataloader_kwargs or {}).get("shuffle", True) is False:
            return iter([part for _ in range(epochs) for part in self.split(mini_batch_size)])
        return mini_batches(self, mini_batch_size, epochs, seed)

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> Self:
        """Each row becomes `n_split` rows: `split_keys` columns are cut along dim 1, the others repeated."""
        return unfold_column_chunks(self, n_split, split_keys)

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append `padding_size` copies of the first (`"first"`) or last row, in place (verl's padding)."""
        if padding_size > 0:
            row = 0 if padding_candidate == "first" else len(self) - 1
            padded = type(self).concat([self, self[row].repeat(padding_size)])
            self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> Self:
        """Rename batch keys in place and return self."""
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old) != len(new):
            raise DataProtoError(f"rename got {len(old)} old keys but {len(new)} new keys; give one new name each.")
        check_keys("batch", old, self.batch.keys() if self.batch is not None else [])
        self.batch.rename_key_(tuple(old), tuple(new))
        return self

    def to_tensordict(self) -> TensorDict:
        """One TensorDict: tensors, non-tensor columns as NonTensorStacks, meta_info values as NonTensorData."""
        return tensordict_io.to_tensordict(self.batch, self.non_tensor_batch, self.meta_info)

    @classmethod
    def from_tensordict(
        cls, tensor_dict: TensorDict, meta_info: dict[str, Any] | None = None, num_batch_dims: int = 1
    ) -> Self:
        """The DataProto that `to_tensordict` made (tensors -> batch, stacks -> columns, data -> meta_info)."""
        if num_batch_dims != 1:
            raise DataProtoError(f"num_batch_dims={num_batch_dims}: a DataProto has exactly one batch dimension.")
        return cls(**tensordict_io.from_tensordict(tensor_dict, meta_info))

    def save_to_disk(self, filepath: str | Path) -> None:
        """Write the whole DataProto to one file (torch.save)."""
        torch.save(self, filepath)

    @staticmethod
    def load_from_disk(filepath: str | Path) -> VerlDataProtoMethods:
        """Read a file written by `save_to_disk` (it unpickles: load only files you trust)."""
        return torch.load(filepath, weights_only=False)


def mini_batches(data: DataProtoT, mini_batch_size: int, epochs: int, seed: int | None = None) -> Iterator[DataProtoT]:
    """`epochs` passes over the rows in mini-batches of `mini_batch_size`, in a fresh random order each epoch.

    The order is drawn from a `torch.Generator` seeded with `seed` (the same seed gives the same batches); the
    rows must divide by `mini_batch_size`.
    """
    if mini_batch_size < 1 or len(data) % mini_batch_size != 0:
        raise DataProtoError(
            f"make_iterator needs a mini_batch_size that divides the {len(data)} rows, got {mini_batch_size}."
        )
    generator = torch.Generator()
    if seed is not None:
        generator.manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator)
        for start in range(0, len(data), mini_batch_size):
            yield data[order[start : start + mini_batch_size]]


def repeat_rows(repeat_times: Sequence[int] | torch.Tensor | np.ndarray, num_rows: int) -> np.ndarray:
    """Row indices that repeat row i `repeat_times[i]` times, rows kept in order (verl's `sample_level_repeat`)."""
    counts = np.asarray(repeat_times.tolist() if isinstance(repeat_times, torch.Tensor) else repeat_times)
    if counts.shape != (num_rows,) or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
        raise DataProtoError(
            f"sample_level_repeat needs one non-negative int per row ({num_rows} rows), got {counts.tolist()}."
        )
    return np.repeat(np.arange(num_rows, dtype=np.int64), counts)


def unfold_column_chunks(data: DataProtoT, n_split: int, split_keys: Sequence[str] | None = None) -> DataProtoT:
    """Each row becomes `n_split` rows: the columns in `split_keys` are cut along their second dimension into
    `n_split` pieces, one per new row; every other column is repeated `n_split` times."""
    split_keys = set(split_keys or [])
    num_rows = len(data)

    def unfold(key: str, value: Any) -> Any:
        if key not in split_keys:
            return (
                np.repeat(value, n_split, axis=0)
                if isinstance(value, np.ndarray)
                else value.repeat_interleave(n_split, dim=0)
            )
        if isinstance(value, np.ndarray) and value.ndim == 1:  # one sequence object per row
            value = np.array([list(row) for row in value], dtype=object)
        if value.ndim < 2 or value.shape[1] % n_split != 0:
            raise DataProtoError(
                f"column '{key}' has per-row shape {list(value.shape[1:])}; its first per-row dimension must divide "
                f"by n_split={n_split}."
            )
        return value.reshape(num_rows * n_split, value.shape[1] // n_split, *value.shape[2:])

    batch = None
    if data.batch is not None:
        tensors = {key: unfold(key, tensor) for key, tensor in data.batch.items()}
        batch = TensorDict(tensors, batch_size=[num_rows * n_split])
    non_tensors = {key: unfold(key, column) for key, column in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(data.meta_info))


def fold_batch_dim(data: DataProtoT, new_batch_size: int) -> DataProtoT:
    """[B, ...] rows -> [new_batch_size, B // new_batch_size, ...]: consecutive rows become one row."""
    if new_batch_size < 1 or len(data) % new_batch_size != 0:
        raise DataProtoError(f"fold_batch_dim: new_batch_size {new_batch_size} must divide the {len(data)} rows.")
    group = len(data) // new_batch_size
    batch = None
    if data.batch is not None:
        tensors = {key: t.reshape(new_batch_size, group, *t.shape[1:]) for key, t in data.batch.items()}
        batch = TensorDict(tensors, batch_size=[new_batch_size])
    non_tensors = {
        key: column.reshape(new_batch_size, group, *column.shape[1:]) for key, column in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(data.meta_info))


def unfold_batch_dim(data: DataProtoT, batch_dims: int = 2) -> DataProtoT:
    """The inverse of `fold_batch_dim`: the first `batch_dims` dimensions of every column become the row axis."""

    def unfold(value: Any) -> Any:
        return value.reshape(-1, *value.shape[batch_dims:])

    batch = None
    if data.batch is not None:
        tensors = {key: unfold(t) for key, t in data.batch.items()}
        batch = TensorDict(tensors, batch_size=[next(iter(tensors.values())).shape[0]] if tensors else [0])
    non_tensors = {key: unfold(column) for key, column in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(data.meta_info))
