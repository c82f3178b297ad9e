"""`collate_fn`: a list of `RLHFDataset` items -> one dict of batched tensors and numpy object arrays.

The result goes straight into `DataProto.from_single_dict`: tensors (stacked, (B, P)) become `batch`, everything
else becomes a 1-D object array of length B in `non_tensor_batch`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def collate_fn(items: list[dict[str, Any]]) -> dict[str, torch.Tensor | np.ndarray]:
    """Stack tensor fields; put every other field in a numpy object array (one entry per item)."""
    if not items:
        raise ValueError("collate_fn: got an empty list of samples.")
    keys = list(items[0])
    for i, item in enumerate(items):
        if list(item) != keys:
            raise ValueError(f"collate_fn: sample {i} has keys {sorted(item)}, but sample 0 has {sorted(keys)}.")
    batch: dict[str, torch.Tensor | np.ndarray] = {}
    for key in keys:
        values = [item[key] for item in items]
        if isinstance(values[0], torch.Tensor):
            batch[key] = torch.stack(values)
        else:
            array = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):
                array[i] = value  # element-wise: numpy must not turn a list of lists into a 2-D array
            batch[key] = array
    return batch
