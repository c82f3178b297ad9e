"""hyflow.protocol is a package whose face keeps the public names: verl's `verl.protocol` names import from it."""

import hyflow.protocol

VERL_PROTOCOL_NAMES = [
    "AUTO_PADDING_KEY",
    "DataProto",
    "DataProtoConfig",
    "DataProtoError",
    "DataProtoFuture",
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


def test_every_public_name_of_the_protocol_imports_from_the_package():
    missing = [name for name in [*VERL_PROTOCOL_NAMES, "Index"] if not hasattr(hyflow.protocol, name)]

    assert missing == []
    assert set(VERL_PROTOCOL_NAMES) <= set(hyflow.protocol.__all__)


def test_the_protocol_is_a_package_of_its_own_files():
    assert hyflow.protocol.__file__.endswith("protocol/__init__.py")
    assert hyflow.protocol.DataProto.__module__ == "hyflow.protocol.dataproto"
