"""DataProtoFuture: a `DataProto` that a worker group has not collected yet (non-blocking dispatch).

A group method registered with `blocking=False` returns a future instead of a `DataProto`. Passed to another group's
method, it travels to those workers as is; each rank resolves it there and keeps its own shard (`chunk`), so the
batch never makes the round trip through the controller. On the controller, `.get()` blocks and returns the batch.

`futures` may hold Ray `ObjectRef`s (resolved with one `ray.get`), nested futures, or plain values. This module never
imports Ray: an `ObjectRef` can only exist if someone else imported Ray already, and it imports nothing of
`hyflow.protocol.dataproto`: a future's values are joined by their own type's `concat`. Import it as
`from hyflow.protocol import DataProtoFuture` (the package re-exports it).

Example::

    future = DataProtoFuture.concat([ref_rank0, ref_rank1])   # one ObjectRef per rank
    shards = future.chunk(2)                                   # each resolves the whole, keeps its half
    batch = future.get()                                       # the joined DataProto
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["DataProtoFuture"]


class Batch(Protocol):
    """What a future resolves to: a `hyflow.protocol.DataProto` (named by its shape here, so that this module does
    not import dataproto.py)."""

    def chunk(self, chunks: int) -> list[Batch]: ...


def _resolve(item: Any) -> Any:
    """A nested DataProtoFuture is resolved with .get(); other values pass through."""
    return item.get() if isinstance(item, DataProtoFuture) else item


def _concat(values: list[Batch]) -> Batch:
    """Joins the resolved shards row-wise with their own class's `concat` (DataProto.concat)."""
    if not values:
        raise ValueError("DataProtoFuture.concat got no results to join; give it one per rank")
    return type(values[0]).concat(values)


def _take_chunk(data: Batch, chunks: int, index: int, inner: Callable[[Batch], Batch] | None) -> Batch:
    data = inner(data) if inner is not None else data
    return data.chunk(chunks)[index]


@dataclass
class DataProtoFuture:
    """A DataProto not collected yet: `get()` resolves `futures`, joins them with `collect_fn`, then `dispatch_fn`.

    `futures` may hold Ray `ObjectRef`s (resolved with one `ray.get`), nested `DataProtoFuture`s, or plain values.
    """

    collect_fn: Callable[[list], Batch]
    futures: list
    dispatch_fn: Callable[[Batch], Batch] | None = None

    @staticmethod
    def concat(data: Sequence[Any]) -> DataProtoFuture:
        """A future that concatenates the results of `data` (ObjectRefs, futures or DataProtos) row-wise."""
        return DataProtoFuture(collect_fn=_concat, futures=list(data))

    def chunk(self, chunks: int) -> list[DataProtoFuture]:
        """`chunks` futures; the i-th resolves this future and takes its i-th equal part."""
        return [
            DataProtoFuture(
                collect_fn=self.collect_fn,
                futures=self.futures,
                dispatch_fn=functools.partial(_take_chunk, chunks=chunks, index=i, inner=self.dispatch_fn),
            )
            for i in range(chunks)
        ]

    def get(self) -> Batch:
        """Block until every future is ready and return the collected (and dispatched) Batch."""
        values = [_resolve(item) for item in self.futures]
        ray = sys.modules.get("ray")  # an ObjectRef can only exist if Ray was imported by someone
        if ray is not None:
            ref_positions = [i for i, value in enumerate(values) if isinstance(value, ray.ObjectRef)]
            if ref_positions:
                resolved = ray.get([values[i] for i in ref_positions])
                for i, value in zip(ref_positions, resolved):
                    values[i] = value
        output = self.collect_fn(values)
        return self.dispatch_fn(output) if self.dispatch_fn is not None else output
