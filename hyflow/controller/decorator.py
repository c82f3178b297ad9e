"""`@register`: how a worker method's arguments are spread over the ranks and its results put back together.

A worker method marked with `@register(dispatch_mode=..., execute_mode=..., blocking=...)` becomes a method of
every `WorkerGroup` built from that worker class. One group call runs three steps:

1. **dispatch** (in the controller): turn the call's arguments into per-rank arguments. A dispatch function
   returns a `ShardedCall` whose positional and keyword values are lists of `world_size` items; the group gives
   item `r` to rank `r` (`WorkerGroup.execute_all_async`).
2. **execute** (on the workers): `Execute.ALL` runs the method on every rank, `Execute.RANK_ZERO` on rank 0 only.
   Inside the worker, `materialize_futures=True` first resolves `DataProtoFuture` arguments (results of another
   group's non-blocking call), so data can flow group to group without a round trip through the controller.
3. **collect** (in the controller): turn the list of per-rank results into the call's result.

Built-in modes (`Dispatch`):

- `ONE_TO_ALL`: every rank gets the same arguments; the result is the list of per-rank results.
- `ALL_TO_ALL`: arguments go as they are, except that a list of exactly `world_size` items is sliced, one item
  per rank; the result is the list of per-rank results.
- `DP_COMPUTE_PROTO`: every `DataProto` argument is padded to a multiple of `world_size` (repeating its first
  rows) and cut into `world_size` equal chunks; other arguments go to every rank. The per-rank `DataProto` results
  are concatenated and the padding rows dropped, so the caller gets one row out per row in.
- `DP_COMPUTE_PROTO_WITH_FUNC`: like `DP_COMPUTE_PROTO`, with a function as the first argument sent to every rank.
- `RANK_ZERO`: the call runs on rank 0 only, with the arguments as given; the result is rank 0's result.

Custom modes: `register_dispatch_mode("my_mode", dispatch_fn, collect_fn)` then `@register(dispatch_mode="my_mode")`,
or pass `dispatch_mode={"dispatch_fn": f, "collect_fn": g}` directly.
`dispatch_fn(world_size, *args, **kwargs) -> ShardedCall` and `collect_fn(outputs: list, pad_size: int) -> Any`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hyflow.protocol import DataProto, DataProtoFuture

__all__ = [
    "REGISTER_ATTR",
    "Dispatch",
    "DispatchMode",
    "Execute",
    "MethodSpec",
    "ShardedCall",
    "get_dispatch_mode",
    "register",
    "register_dispatch_mode",
    "resolve_future_args",
]

# The attribute `@register` sets on a worker method; WorkerGroup looks for it to find the group's methods.
REGISTER_ATTR = "__hyflow_register__"


class Dispatch(Enum):
    """How a group call's arguments are split over the ranks and its results joined (see the module docstring)."""

    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    DP_COMPUTE_PROTO = "dp_compute_proto"
    DP_COMPUTE_PROTO_WITH_FUNC = "dp_compute_proto_with_func"
    RANK_ZERO = "rank_zero"


class Execute(Enum):
    """Which ranks run the method: all of them, or rank 0 only (its result is returned as it is)."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass
class ShardedCall:
    """Per-rank arguments: each positional value and each keyword value is a list with one item per rank
    (or a value that every rank receives as it is). `pad_size` rows were added by padding and are dropped on collect."""

    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)
    pad_size: int = 0


DispatchFn = Callable[..., ShardedCall]
CollectFn = Callable[[list, int], Any]


@dataclass(frozen=True)
class DispatchMode:
    """A dispatch function and the collect function that undoes it."""

    dispatch_fn: DispatchFn
    collect_fn: CollectFn


@dataclass(frozen=True)
class MethodSpec:
    """What `@register` records on a worker method."""

    dispatch_mode: Dispatch | str | DispatchMode
    execute_mode: Execute
    blocking: bool
    materialize_futures: bool


# ---- the built-in dispatch / collect functions ----
def _broadcast(world_size: int, value: Any) -> list:
    return [value] * world_size


def dispatch_one_to_all(world_size: int, *args: Any, **kwargs: Any) -> ShardedCall:
    """Every rank gets every argument as it is."""
    return ShardedCall(
        args=tuple(_broadcast(world_size, a) for a in args),
        kwargs={k: _broadcast(world_size, v) for k, v in kwargs.items()},
    )


def dispatch_all_to_all(world_size: int, *args: Any, **kwargs: Any) -> ShardedCall:
    """Arguments go unchanged; lists of `world_size` items are sliced one per rank when the call executes."""
    return ShardedCall(args=args, kwargs=dict(kwargs))


def collect_all(outputs: list, pad_size: int = 0) -> list:
    """The list of per-rank results, in rank order."""
    return list(outputs)


def collect_first(outputs: list, pad_size: int = 0) -> Any:
    """Rank 0's result."""
    return outputs[0]


def _dataproto_length(world_size: int, args: tuple, kwargs: dict) -> int | None:
    lengths = {
        name: len(value)
        for name, value in [*((f"argument {i}", a) for i, a in enumerate(args)), *kwargs.items()]
        if isinstance(value, DataProto)
    }
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"DP_COMPUTE_PROTO needs every DataProto argument to have the same number of rows, got {lengths}. "
            "Pass DataProtos of equal length (or union them into one)."
        )
    return next(iter(lengths.values()), None)


def dispatch_dp_compute_data_proto(world_size: int, *args: Any, **kwargs: Any) -> ShardedCall:
    """Pad every DataProto to a multiple of `world_size` and cut it into `world_size` chunks.

    A `DataProtoFuture` is chunked lazily (each rank resolves it and keeps its own part); its rows must divide by
    `world_size`. Other values go to every rank.
    """
    length = _dataproto_length(world_size, args, kwargs)
    pad_size = 0 if length is None else -length % world_size

    def shard(value: Any) -> list:
        if isinstance(value, DataProto):
            padded, _ = value.pad_to_divisor(world_size)
            return padded.chunk(world_size)
        if isinstance(value, DataProtoFuture):
            return value.chunk(world_size)
        return _broadcast(world_size, value)

    return ShardedCall(
        args=tuple(shard(a) for a in args), kwargs={k: shard(v) for k, v in kwargs.items()}, pad_size=pad_size
    )


def dispatch_dp_compute_data_proto_with_func(world_size: int, func: Callable, *args: Any, **kwargs: Any) -> ShardedCall:
    """`func` goes to every rank; the remaining arguments are split like `DP_COMPUTE_PROTO`."""
    if not callable(func):
        raise ValueError(
            f"DP_COMPUTE_PROTO_WITH_FUNC takes a function as its first argument, got {type(func).__name__}. "
            "Call it as wg.method(func, data)."
        )
    sharded = dispatch_dp_compute_data_proto(world_size, *args, **kwargs)
    sharded.args = (_broadcast(world_size, func), *sharded.args)
    return sharded


def collect_dp_compute_data_proto(outputs: list, pad_size: int = 0) -> Any:
    """Concatenate per-rank DataProtos in rank order and drop the padding rows; other results come back as a list."""
    if not all(isinstance(out, DataProto) for out in outputs):
        return list(outputs)
    joined = DataProto.concat(outputs)
    # Results without rows (e.g. only meta_info metrics) carry no padding to drop.
    return joined.unpad(pad_size) if pad_size and len(joined) > 0 else joined


_DISPATCH_MODES: dict[Dispatch | str, DispatchMode] = {
    Dispatch.ONE_TO_ALL: DispatchMode(dispatch_one_to_all, collect_all),
    Dispatch.ALL_TO_ALL: DispatchMode(dispatch_all_to_all, collect_all),
    Dispatch.DP_COMPUTE_PROTO: DispatchMode(dispatch_dp_compute_data_proto, collect_dp_compute_data_proto),
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: DispatchMode(
        dispatch_dp_compute_data_proto_with_func, collect_dp_compute_data_proto
    ),
    Dispatch.RANK_ZERO: DispatchMode(dispatch_all_to_all, collect_first),
}


def register_dispatch_mode(name: str, dispatch_fn: DispatchFn, collect_fn: CollectFn) -> None:
    """Add a custom dispatch mode, usable as `@register(dispatch_mode=name)`.

    `dispatch_fn(world_size, *args, **kwargs) -> ShardedCall`; `collect_fn(outputs, pad_size) -> result`.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a custom dispatch mode needs a non-empty string name, got {name!r}.")
    if name in _DISPATCH_MODES or name in {d.value for d in Dispatch}:
        raise ValueError(f"dispatch mode {name!r} is already registered; pick another name.")
    if not (callable(dispatch_fn) and callable(collect_fn)):
        raise ValueError(f"register_dispatch_mode({name!r}, ...) needs two callables: dispatch_fn and collect_fn.")
    _DISPATCH_MODES[name] = DispatchMode(dispatch_fn, collect_fn)


def get_dispatch_mode(mode: Dispatch | str | DispatchMode | dict) -> DispatchMode:
    """The dispatch/collect pair for a `Dispatch` member, a registered name, or an explicit pair."""
    if isinstance(mode, DispatchMode):
        return mode
    if isinstance(mode, dict):
        if set(mode) != {"dispatch_fn", "collect_fn"}:
            raise ValueError(
                f"a dispatch_mode dict needs exactly the keys 'dispatch_fn' and 'collect_fn', got {sorted(mode)}."
            )
        return DispatchMode(mode["dispatch_fn"], mode["collect_fn"])
    if mode in _DISPATCH_MODES:
        return _DISPATCH_MODES[mode]
    known = [d.name for d in Dispatch] + [m for m in _DISPATCH_MODES if isinstance(m, str)]
    raise ValueError(
        f"unknown dispatch_mode {mode!r}. Allowed: {known}; add your own with register_dispatch_mode(name, "
        "dispatch_fn, collect_fn)."
    )


# ---- resolving futures inside the worker ----
def _materialize(value: Any) -> Any:
    if isinstance(value, DataProtoFuture):
        return value.get()
    return value


def resolve_future_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Resolve `DataProtoFuture` arguments (Ray resolves top-level ObjectRefs itself before the call)."""
    return tuple(_materialize(a) for a in args), {k: _materialize(v) for k, v in kwargs.items()}


def register(
    dispatch_mode: Dispatch | str | dict = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
) -> Callable[[Callable], Callable]:
    """Mark a `Worker` method as a worker-group method (see the module docstring for the modes).

    `Dispatch.RANK_ZERO` implies `Execute.RANK_ZERO`. `blocking=False` makes the group call return at once:
    a `DataProtoFuture` for DataProto modes (pass it to another group's method or call `.get()`), the per-rank
    handles (Ray ObjectRefs, which `ray.get` accepts) for `ONE_TO_ALL` / `ALL_TO_ALL` / `RANK_ZERO`.
    """
    if not isinstance(dispatch_mode, (Dispatch, str, dict)):
        raise ValueError(
            f"register(dispatch_mode=...) takes a Dispatch member, a registered mode name or a "
            f"{{'dispatch_fn', 'collect_fn'}} dict, got {dispatch_mode!r}. "
            f"Allowed members: {[d.name for d in Dispatch]}."
        )
    if not isinstance(execute_mode, Execute):
        raise ValueError(
            f"register(execute_mode=...) takes an Execute member, got {execute_mode!r}. "
            f"Allowed: {[e.name for e in Execute]}."
        )
    if dispatch_mode is Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO
    spec = MethodSpec(dispatch_mode, execute_mode, blocking, materialize_futures)

    def decorator(func: Callable) -> Callable:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_inner(*args: Any, **kwargs: Any) -> Any:
                if materialize_futures:
                    args, kwargs = resolve_future_args(args, kwargs)
                return await func(*args, **kwargs)

            setattr(async_inner, REGISTER_ATTR, spec)
            return async_inner

        @functools.wraps(func)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if materialize_futures:
                args, kwargs = resolve_future_args(args, kwargs)
            return func(*args, **kwargs)

        setattr(inner, REGISTER_ATTR, spec)
        return inner

    return decorator
