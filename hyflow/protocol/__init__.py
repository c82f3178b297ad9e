"""DataProto, the batch that travels between the single controller and the worker groups, and its future.

    from hyflow.protocol import DataProto, DataProtoFuture

Import from here; the files behind it, each with one role:

    dataproto.py      the `DataProto` class: construction, indexing, union, concat / chunk / split, padding
    future.py         `DataProtoFuture`: a result a worker group has not collected yet (imports neither Ray nor
                      dataproto.py)
    values.py         row values: object arrays, equality for `union`, row indexing, key checks, `DataProtoError`
    tensordict_io.py  a DataProto as one TensorDict, and verl's tensor (de)serialisation helpers
    verl_methods.py   verl's methods beyond the core (`make_iterator`, `reorder`, ...) and `fold_batch_dim`

The names below are verl's `verl.protocol` names, so code ported from verl imports them from here unchanged.
"""

from hyflow.protocol.dataproto import (
    AUTO_PADDING_KEY,
    DataProto,
    DataProtoConfig,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)
from hyflow.protocol.future import DataProtoFuture
from hyflow.protocol.tensordict_io import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
from hyflow.protocol.values import DataProtoError, Index, union_numpy_dict, union_tensor_dict
from hyflow.protocol.verl_methods import fold_batch_dim, unfold_batch_dim

__all__ = [
    "AUTO_PADDING_KEY",
    "DataProto",
    "DataProtoConfig",
    "DataProtoError",
    "DataProtoFuture",
    "Index",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]
