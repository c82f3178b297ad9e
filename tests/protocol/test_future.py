"""Tests for hyflow.protocol.future: DataProtoFuture collects, chunks, pickles and resolves Ray object refs."""

import ast
import pickle
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import hyflow.protocol
import hyflow.protocol.future
from hyflow.protocol import DataProto
from hyflow.protocol.future import DataProtoFuture


def make_proto(num_rows: int) -> DataProto:
    """Row i carries input_ids [i, i], so row identity is easy to check."""
    rows = torch.arange(num_rows)
    return DataProto.from_dict({"input_ids": torch.stack([rows, rows], dim=1)})


def row_ids(data: DataProto) -> list[int]:
    return data.batch["input_ids"][:, 0].tolist()


def test_protocol_re_exports_the_same_future_class():
    assert hyflow.protocol.DataProtoFuture is hyflow.protocol.future.DataProtoFuture


def test_importing_the_future_module_first_works_and_does_not_import_ray():
    code = (
        "import sys, hyflow.protocol.future as f; f.DataProtoFuture.concat([]); "
        "assert 'ray' not in sys.modules, 'ray was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_future_of_plain_values_collects_and_dispatches():
    future = DataProtoFuture(
        collect_fn=DataProto.concat, futures=[make_proto(2), make_proto(2)], dispatch_fn=lambda d: d[:3]
    )
    assert row_ids(future.get()) == [0, 1, 0]


def test_future_concat_joins_nested_futures_and_protos():
    inner = DataProtoFuture(collect_fn=DataProto.concat, futures=[make_proto(1)])
    future = DataProtoFuture.concat([inner, make_proto(2)])
    assert row_ids(future.get()) == [0, 0, 1]


def test_future_chunk_gives_one_future_per_shard():
    future = DataProtoFuture.concat([make_proto(3), make_proto(3)])
    shards = future.chunk(3)
    assert [row_ids(shard.get()) for shard in shards] == [[0, 1], [2, 0], [1, 2]]
    halves_of_first_shard = shards[0].chunk(2)
    assert [row_ids(h.get()) for h in halves_of_first_shard] == [[0], [1]]


def test_future_chunk_survives_pickling():
    shard = DataProtoFuture.concat([make_proto(4)]).chunk(2)[1]
    assert row_ids(pickle.loads(pickle.dumps(shard)).get()) == [2, 3]


def test_future_resolves_ray_object_refs_with_one_ray_get(monkeypatch):
    class FakeRef:
        def __init__(self, value):
            self.value = value

    calls = []

    def fake_get(refs):
        calls.append(len(refs))
        return [ref.value for ref in refs]

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(ObjectRef=FakeRef, get=fake_get))
    future = DataProtoFuture.concat([FakeRef(make_proto(1)), make_proto(2), FakeRef(make_proto(1))])
    assert row_ids(future.get()) == [0, 0, 1, 0]
    assert calls == [2]


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_future_resolves_real_ray_object_refs():
    ray = pytest.importorskip("ray")
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        refs = [ray.put(make_proto(2)), ray.put(make_proto(2)[1:])]
        assert row_ids(DataProtoFuture.concat(refs).get()) == [0, 1, 1]
    finally:
        if started_here:
            ray.shutdown()


def test_the_future_module_imports_nothing_of_the_protocol_module_that_re_exports_it():
    tree = ast.parse(Path(hyflow.protocol.future.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {name for name in imported if name and name.startswith("hyflow")}


def test_future_concat_of_nothing_names_the_fix():
    with pytest.raises(ValueError, match="one per rank"):
        DataProtoFuture.concat([]).get()
