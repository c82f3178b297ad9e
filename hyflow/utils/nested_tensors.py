"""Jagged nested tensors as batch columns: a (B, *ragged*, ...) tensor holds B rows of different lengths (packed
sequences; `.offsets()` are the cu_seqlens), and these functions build, split and join them row by row.

    ids = nested_tensor_from_tensor_list([torch.arange(3), torch.arange(5)])   # (2, *j*)
    rows = nested_rows(ids)                                                   # [tensor of 3, tensor of 5]
    both = concat_nested_tensors([ids, ids])                                  # (4, *j*)

`ragged_idx` counts the batch dimension: 1 is the rows' first dimension. M-RoPE position ids are (B, 4, *T*), ragged
at 2. Mistakes raise `DataProtoError`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDict

from hyflow.protocol.values import DataProtoError

__all__ = [
    "concat_nested_tensors",
    "maybe_fix_3d_position_ids",
    "nested_like",
    "nested_rows",
    "nested_tensor_from_tensor_list",
    "ragged_idx",
]


def ragged_idx(tensor: torch.Tensor) -> int:
    """The ragged dimension of a jagged nested tensor (counting the batch dimension)."""
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


def nested_rows(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The rows of a jagged nested tensor (unbind, with a padded fallback where unbind fails for 3-D ones)."""
    try:
        return list(tensor.unbind(0))
    except RuntimeError:  # torch's unbind of 3-D jagged tensors splits the wrong dim (pytorch#153238)
        padded = tensor.to_padded_tensor(0)
        lengths = tensor.offsets().diff().tolist()
        dim = ragged_idx(tensor) - 1
        return [padded[i].narrow(dim, 0, length) for i, length in enumerate(lengths)]


def nested_like(rows: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """`rows` as a jagged nested tensor ragged where `like` is."""
    return nested_tensor_from_tensor_list(rows, ragged_idx=ragged_idx(like))


def concat_nested_tensors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The rows of several jagged nested tensors, in order, as one nested tensor."""
    for tensor in tensors:
        if not (tensor.is_nested and tensor.is_contiguous() and tensor.dim() >= 2):
            raise DataProtoError(f"concat_nested_tensors takes contiguous jagged tensors; got shape {tensor.shape}.")
    return nested_like([row for tensor in tensors for row in nested_rows(tensor)], tensors[0])


def maybe_fix_3d_position_ids(data: TensorDict) -> None:
    """Restore the ragged dimension of 3-D nested `position_ids` (M-RoPE), which a pickle round trip loses."""
    position_ids = data.get("position_ids", None)
    if isinstance(position_ids, torch.Tensor) and position_ids.is_nested and position_ids.dim() == 3:
        position_ids._ragged_idx = 2
