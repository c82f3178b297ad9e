"""`WorkerGroup`: the controller's handle on a set of workers, one method per `@register`-ed worker method.

The whole path of a group call, `wg.update_actor(batch)`, is two functions here:

    group method  (made by `_bind_method`, named after the worker method)
      └─ WorkerGroup._call: dispatch (decorator.py) → submit to each rank (backend's `_submit`)
                            → block on the results (backend's `_wait`) → collect (decorator.py)

and on the worker, the `@register` wrapper resolves futures and calls the method itself. Backends implement three
things: `world_size`, `_submit(rank, method_name, args, kwargs)` (start the call on one rank, return a handle) and
`_wait(handles, method_name, timeout_s)` (turn handles into results, raising `WorkerError`,
`WorkerDiedError` or `WorkerTimeoutError`). `LocalWorkerGroup` (local.py) calls the method in-process;
`RayWorkerGroup` (ray_group.py) calls Ray actors.

Every group method takes an optional `timeout=` (seconds) on top of the worker method's own arguments, overriding
the group's `timeout_s` (None: wait forever); a worker method that itself declares a `timeout` parameter gets it,
and its calls use the group's `timeout_s`.

Colocated roles: a group built from `create_colocated_worker_cls({...})` (colocate.py) holds one process per rank
with several role objects inside; `spawn(prefix_set)` returns one group per role whose methods reach that role.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hyflow.controller.decorator import (
    PADDING_SIZE_KEY,
    REGISTER_ATTR,
    Execute,
    MethodSpec,
    collect_all_to_all,
    collect_rank_zero,
    get_dispatch_mode,
)
from hyflow.controller.worker import Worker
from hyflow.protocol import DataProto, DataProtoFuture

__all__ = ["ClassWithInitArgs", "GroupFuture", "WorkerGroup"]


# Separates role and method in the methods of a colocated worker class: "critic__compute_values".
ROLE_SEPARATOR = "__"


class ClassWithInitArgs:
    """A worker class and the arguments to build it with, plus backend options (e.g. Ray actor options).

    `options` are passed to `ray.remote(...).options(**options)` by the Ray backend (`num_cpus`, `runtime_env`,
    `max_concurrency`, ...); the local backend ignores them.
    """

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        # A class already wrapped by `ray.remote` is unwrapped: groups apply Ray themselves.
        self.cls: type = getattr(cls, "__ray_actor_class__", cls)
        self.args = args
        self.kwargs = kwargs
        self.options: dict[str, Any] = {}

    def update_options(self, options: dict[str, Any]) -> None:
        """Add backend options (merged over earlier ones)."""
        self.options.update(options)

    def __call__(self) -> Any:
        return self.cls(*self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cls.__name__}, options={self.options})"


class GroupFuture(DataProtoFuture):
    """The result of a non-blocking group call: `.get()` waits and collects, raising the group's clear errors.

    Sent to another group's workers (pickled), it travels as a plain `DataProtoFuture` over the same handles.
    """

    def __init__(self, group: WorkerGroup, method_name: str, handles: list, collect_fn: Callable[[list], Any]) -> None:
        super().__init__(collect_fn=collect_fn, futures=handles)
        self._group = group
        self._method_name = method_name

    def get(self) -> Any:
        return self.collect_fn(self._group._wait(self.futures, self._method_name, self._group.timeout_s))

    def __reduce__(self) -> tuple:
        return DataProtoFuture, (self.collect_fn, self.futures, self.dispatch_fn)


@dataclass(frozen=True)
class GroupShape:
    """What a collect function may read of its group once a future travels to another worker: the world size and
    the nd-compute mesh info (dp rank and collect flag per worker, by mesh name; see nd_dispatch.py)."""

    world_size: int
    _dispatch_info: dict[str, list[int]] = field(default_factory=dict)
    _collect_info: dict[str, list[bool]] = field(default_factory=dict)


class _Collect:
    """A picklable collect step: `collect_fn(group, outputs)`, then the padding rows of a DataProto dropped.

    It holds the group's shape, not the group, so a future that travels to other workers does not carry the group's
    actor handles and placement groups (nor the call's inputs)."""

    def __init__(self, collect_fn: Callable[[Any, list], Any], group: WorkerGroup, pad_size: int) -> None:
        self.collect_fn = collect_fn
        self.group = GroupShape(group.world_size, dict(group._dispatch_info), dict(group._collect_info))
        self.pad_size = pad_size

    def __call__(self, outputs: list) -> Any:
        result = self.collect_fn(self.group, outputs)
        # Results without rows (e.g. only meta_info metrics) carry no padding to drop.
        if self.pad_size and isinstance(result, DataProto) and len(result) > 0:
            result = result.unpad(self.pad_size)
        return result


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Name → spec of every `@register`-ed method of `cls` (inherited ones included)."""
    methods = {}
    for name in dir(cls):
        spec = getattr(getattr(cls, name, None), REGISTER_ATTR, None)
        if isinstance(spec, MethodSpec):
            methods[name] = spec
    return methods


class WorkerGroup:
    """Base class of the backends: binds group methods and runs dispatch → execute → collect."""

    def __init__(self, worker_cls: type, timeout_s: float | None = None) -> None:
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise ValueError(
                f"worker class {worker_cls!r} does not subclass hyflow.controller.Worker; a group needs a Worker "
                "subclass (it provides rank, world_size and the group's bookkeeping). Write `class MyWorker(Worker):`."
            )
        self.worker_cls = worker_cls
        self.timeout_s = timeout_s
        self._bound_methods: list[str] = []
        self._roles: dict[str, type] = {}  # role -> class, for groups of colocated workers
        # nd-compute dispatch: each worker's dp rank and collect flag per mesh name, asked once (nd_dispatch.py)
        self._dispatch_info: dict[str, list[int]] = {}
        self._collect_info: dict[str, list[bool]] = {}

    # ---- what a backend provides ----
    @property
    def world_size(self) -> int:
        raise NotImplementedError

    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError

    def _wait(self, handles: list, method_name: str, timeout_s: float | None) -> list:
        raise NotImplementedError

    # ---- group methods ----
    def _bind_worker_methods(self, worker_cls: type, role: str | None = None) -> None:
        """Give this group one method per registered method of `worker_cls` (of one role, for colocated ones)."""
        self._roles = dict(getattr(worker_cls, "colocated_roles", {}))
        prefix = f"{role}{ROLE_SEPARATOR}" if role else ""
        for remote_name, spec in registered_methods(worker_cls).items():
            if not remote_name.startswith(prefix):
                continue
            name = remote_name.removeprefix(prefix)
            if hasattr(self, name):  # a WorkerGroup method, property or instance attribute (e.g. `workers`)
                raise ValueError(
                    f"worker method {worker_cls.__name__}.{remote_name} has the name of a WorkerGroup attribute "
                    f"({name!r}); rename the worker method."
                )
            setattr(self, name, self._bind_method(name, remote_name, spec, getattr(worker_cls, remote_name)))
            self._bound_methods.append(name)

    def _bind_method(self, name: str, remote_name: str, spec: MethodSpec, worker_method: Callable) -> Callable:
        takes_timeout = "timeout" in _parameter_names(worker_method)

        def group_method(*args: Any, **kwargs: Any) -> Any:
            timeout_s = self.timeout_s if takes_timeout else kwargs.pop("timeout", self.timeout_s)
            return self._call(remote_name, spec, args, kwargs, timeout_s)

        group_method.__name__ = name
        group_method.__qualname__ = f"{type(self).__name__}.{name}"
        group_method.__doc__ = worker_method.__doc__
        return group_method

    def _call(self, method_name: str, spec: MethodSpec, args: tuple, kwargs: dict, timeout_s: float | None) -> Any:
        """dispatch → execute on the ranks → (wait) → collect. `timeout=` on a call overrides the group's."""
        mode = get_dispatch_mode(spec.dispatch_mode)
        args, kwargs = mode["dispatch_fn"](self, *args, **kwargs)
        pad_size = kwargs.pop(PADDING_SIZE_KEY, 0)
        if spec.execute_mode is Execute.RANK_ZERO:
            handles = [self._submit(0, method_name, *self._rank_args(0, args, kwargs))]
            collect = _Collect(collect_rank_zero, self, 0)
        else:
            handles = self.execute_all_async(method_name, *args, **kwargs)
            collect = _Collect(mode["collect_fn"], self, pad_size)
        if not spec.blocking:
            return self._pending(method_name, handles, collect)
        return collect(self._wait(handles, method_name, timeout_s))

    def _pending(self, method_name: str, handles: list, collect: _Collect) -> Any:
        """What a `blocking=False` call returns, as in verl: the handles themselves when the result is per rank (a
        list of Ray ObjectRefs that `ray.get` accepts; rank 0's one ref for rank-zero calls), else a `GroupFuture`
        (a `DataProtoFuture`: `.get()`, or pass it to another group)."""
        if collect.collect_fn is collect_rank_zero:
            return handles[0]
        if collect.collect_fn is collect_all_to_all:
            return list(handles)
        return GroupFuture(self, method_name, handles, collect)

    def _rank_args(self, rank: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Rank `rank`'s arguments: lists of `world_size` items are sliced, other values go as they are."""

        def pick(value: Any) -> Any:
            return value[rank] if isinstance(value, list) and len(value) == self.world_size else value

        return tuple(pick(a) for a in args), {k: pick(v) for k, v in kwargs.items()}

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list:
        """Start `method_name` on every rank; return one handle per rank (Ray ObjectRefs, or results in-process).

        A positional or keyword value that is a list of exactly `world_size` items is sliced: rank r gets item r.
        """
        ranks = range(self.world_size)
        return [self._submit(rank, method_name, *self._rank_args(rank, args, kwargs)) for rank in ranks]

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list:
        """`execute_all_async`, then wait: the list of per-rank results."""
        return self._wait(self.execute_all_async(method_name, *args, **kwargs), method_name, self.timeout_s)

    def execute_all(self, method_name: str, *args: Any, **kwargs: Any) -> list:
        """Same as `execute_all_sync`."""
        return self.execute_all_sync(method_name, *args, **kwargs)

    def execute_rank_zero(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Run `method_name` on rank 0 only and return its result."""
        return self._wait([self._submit(0, method_name, args, kwargs)], method_name, self.timeout_s)[0]

    # ---- colocated roles ----
    @property
    def roles(self) -> list[str]:
        """The roles of a colocated group (empty for a group of one worker class)."""
        return list(self._roles)

    def spawn(self, prefix_set: Iterable[str]) -> dict[str, WorkerGroup]:
        """One group per role of a colocated group; they share this group's workers (same processes)."""
        prefix_set = list(prefix_set)
        unknown = [p for p in prefix_set if p not in self._roles]
        if unknown:
            raise ValueError(
                f"spawn(prefix_set={prefix_set}): {unknown} are not roles of this group. Roles: {self.roles} (from "
                "create_colocated_worker_cls). Spawn only from a group built from a colocated worker class."
            )
        return {role: self._role_view(role) for role in prefix_set}

    def fuse(self, prefix_set: Iterable[str]) -> None:
        """Make each role's group an attribute of this one: `wg.actor.add(...)` (verl's fused-worker groups)."""
        for role, view in self.spawn(prefix_set).items():
            if role in self.__dict__ or hasattr(type(self), role):
                raise ValueError(
                    f"fuse: role {role!r} has the name of an attribute of this group; rename the role in "
                    "create_colocated_worker_raw_cls."
                )
            setattr(self, role, view)

    def _role_view(self, role: str) -> WorkerGroup:
        view = object.__new__(type(self))
        view.__dict__.update({k: v for k, v in self.__dict__.items() if k not in self._bound_methods})
        view._bound_methods = []
        view._dispatch_info, view._collect_info = {}, {}  # each role registers its own meshes
        view._bind_worker_methods(self.worker_cls, role=role)
        view._roles = {}
        return view


def _parameter_names(func: Callable) -> list[str]:
    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return []
