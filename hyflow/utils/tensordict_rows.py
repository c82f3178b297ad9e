"""A TensorDict's rows: select, concatenate, chunk, iterate in mini-batches, pad to a divisor and back.

    part = index_select_tensor_dict(td, [0, 2])         # nested tensors and columns keep their rows
    first, second = chunk_tensordict(td, 2)
    whole = concat_tensordict([first, second])
    padded, pad_size = pad_to_divisor(td, 4); td = unpad(padded, pad_size)

Every row operation keeps the batch-level values (`NonTensorData`) as they are; jagged nested tensors are cut and
joined row by row (`hyflow.utils.nested_tensors`). Mistakes raise `DataProtoError`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData

from hyflow.protocol.values import DataProtoError
from hyflow.utils.nested_tensors import concat_nested_tensors, nested_like, nested_rows

logger = logging.getLogger(__name__)

__all__ = [
    "chunk_tensordict",
    "concat_tensordict",
    "contiguous",
    "index_select_tensor_dict",
    "make_iterator",
    "pad_to_divisor",
    "unpad",
]


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
            rows = nested_rows(value)
            fields[key] = nested_like([rows[i] for i in indices.tolist()], value)
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
        rows = nested_rows(td[key])
        for i, part in enumerate(parts):
            part[key] = nested_like(rows[i * size : (i + 1) * size], td[key])
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
