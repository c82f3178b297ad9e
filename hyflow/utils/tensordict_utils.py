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

This module is the one import path; each name lives with its role: keys and values (building, reading, subsets,
union, equality) in `tensordict_columns`, row operations (select, concat, chunk, iterate, pad) in
`tensordict_rows`, jagged nested tensors in `nested_tensors`.
"""

from __future__ import annotations

from hyflow.utils.nested_tensors import concat_nested_tensors, maybe_fix_3d_position_ids, nested_tensor_from_tensor_list
from hyflow.utils.tensordict_columns import (
    assert_tensordict_eq,
    assign_non_tensor,
    assign_non_tensor_data,
    assign_non_tensor_stack,
    get,
    get_keys,
    get_non_tensor_data,
    get_tensordict,
    list_of_dict_to_tensordict,
    pop,
    pop_keys,
    union_tensor_dict,
    unwrap_non_tensor_data,
)
from hyflow.utils.tensordict_rows import (
    chunk_tensordict,
    concat_tensordict,
    contiguous,
    index_select_tensor_dict,
    make_iterator,
    pad_to_divisor,
    unpad,
)

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
