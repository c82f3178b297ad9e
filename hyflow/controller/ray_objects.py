"""Putting values into Ray's object store: `parallel_put`, one `ray.put` per value, several at a time.

    refs = parallel_put([chunk0, chunk1, chunk2, chunk3])   # ObjectRefs in the same order
    ray.get(refs)                                           # the values back

A value put once and passed by its ref to several actors is serialised once, not once per actor; the threads
overlap the serialisation of large values (tensors release the GIL while they are copied). This module imports Ray;
`hyflow.controller` loads it only when `parallel_put` is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from hyflow.controller.errors import ControllerUsageError

__all__ = ["parallel_put"]

DEFAULT_MAX_WORKERS = 16


def parallel_put(data_list: Sequence[Any], max_workers: int | None = None) -> list[ray.ObjectRef]:
    """`ray.put` every value of `data_list` with up to `max_workers` threads (default min(len, 16)); refs in order."""
    if len(data_list) == 0:
        raise ControllerUsageError("parallel_put got an empty list; pass at least one value to put.")
    if max_workers is not None and max_workers < 1:
        raise ControllerUsageError(f"parallel_put(max_workers={max_workers}): it must be at least 1 (or None).")
    max_workers = min(len(data_list), max_workers or DEFAULT_MAX_WORKERS)
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        return list(pool.map(ray.put, data_list))
