"""The single-controller runtime: workers, the `@register` decorator, and worker groups on Ray or in-process.

    from hyflow.controller import Worker, register, Dispatch, RayResourcePool, RayClassWithInitArgs, RayWorkerGroup

    class Doubler(Worker):
        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def double(self, data: DataProto) -> DataProto:      # gets this rank's shard
            return DataProto.from_dict({"x": data.batch["x"] * 2})

    init_ray()
    wg = RayWorkerGroup(RayResourcePool([4], use_gpu=False), RayClassWithInitArgs(Doubler))
    out = wg.double(data)                                    # split over 4 actors, results joined in order
    wg = LocalWorkerGroup(RayClassWithInitArgs(Doubler))     # same API, one worker, in this process

Files: decorator.py (register, Dispatch, Execute, dispatch/collect functions, DISPATCH_MODE_FN_REGISTRY),
dynamic_enum.py (DynamicEnum, which Dispatch is), nd_dispatch.py (make_nd_compute_dataproto_dispatch_fn),
worker.py (Worker, its mesh records), worker_group.py (WorkerGroup: dispatch → execute → collect), local.py
(LocalWorkerGroup), colocate.py (create_colocated_worker_cls / _raw_cls / _cls_fused), ray_pool.py (init_ray,
RayResourcePool, split_resource_pool, merge_resource_pool), ray_group.py (RayWorkerGroup), ray_objects.py
(parallel_put), errors.py (WorkerError, WorkerDiedError, WorkerTimeoutError, ControllerUsageError).

Importing this package does not import Ray: the Ray names below are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from hyflow.controller.colocate import (
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
)
from hyflow.controller.decorator import Dispatch, Execute, register, register_dispatch_mode, update_dispatch_mode
from hyflow.controller.errors import (
    ControllerUsageError,
    WorkerDiedError,
    WorkerError,
    WorkerGroupError,
    WorkerTimeoutError,
)
from hyflow.controller.local import LocalWorkerGroup
from hyflow.controller.worker import Worker
from hyflow.controller.worker_group import ClassWithInitArgs, WorkerGroup

# Ray takes no part in choosing a class's init arguments; the Ray backend reads `options` from the same object.
RayClassWithInitArgs = ClassWithInitArgs

_RAY_NAMES = {
    "RayResourcePool": "hyflow.controller.ray_pool",
    "init_ray": "hyflow.controller.ray_pool",
    "RayWorkerGroup": "hyflow.controller.ray_group",
    "parallel_put": "hyflow.controller.ray_objects",
    "split_resource_pool": "hyflow.controller.ray_pool",
    "merge_resource_pool": "hyflow.controller.ray_pool",
}

__all__ = [
    "ClassWithInitArgs",
    "ControllerUsageError",
    "Dispatch",
    "Execute",
    "LocalWorkerGroup",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerTimeoutError",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "init_ray",
    "merge_resource_pool",
    "parallel_put",
    "register",
    "register_dispatch_mode",
    "split_resource_pool",
    "update_dispatch_mode",
]


def __getattr__(name: str) -> Any:
    """Load the Ray backend on first use of one of its names."""
    if name in _RAY_NAMES:
        return getattr(importlib.import_module(_RAY_NAMES[name]), name)
    raise AttributeError(f"module 'hyflow.controller' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_RAY_NAMES])
