"""`@register`: how a worker method's arguments are spread over the ranks and its results put back together.

A worker method marked with `@register(dispatch_mode=..., execute_mode=..., blocking=...)` becomes a method of
every `WorkerGroup` built from that worker class. One group call runs three steps:

1. **dispatch** (in the controller): turn the call's arguments into per-rank arguments. A dispatch function
   `dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)` (verl's contract) returns values that are lists
   of `world_size` items; the group gives item `r` to rank `r` (`WorkerGroup.execute_all_async`). A dispatch that
   padded rows says how many under the keyword `PADDING_SIZE_KEY`, which the group takes out before the call.
2. **execute** (on the workers): `Execute.ALL` runs the method on every rank, `Execute.RANK_ZERO` on rank 0 only.
   Inside the worker, `materialize_futures=True` first resolves `DataProtoFuture` arguments (results of another
   group's non-blocking call), so data can flow group to group without a round trip through the controller.
3. **collect** (in the controller): `collect_fn(worker_group, outputs)` turns the list of per-rank results into
   the call's result; the group then drops the padding rows of a `DataProto` result.

Built-in modes (`Dispatch`):

- `ONE_TO_ALL`: every rank gets the same arguments; the result is the list of per-rank results.
- `ALL_TO_ALL`: arguments go as they are, except that a list of exactly `world_size` items is sliced, one item
  per rank; the result is the list of per-rank results.
- `DP_COMPUTE`: every argument is already a list of `world_size` items, one per rank; the result is the list.
- `DP_COMPUTE_PROTO`: every `DataProto` argument is padded to a multiple of `world_size` (repeating its first
  rows) and cut into `world_size` equal chunks; other arguments go to every rank. The per-rank `DataProto` results
  are concatenated and the padding rows dropped, so the caller gets one row out per row in.
- `DP_COMPUTE_METRIC`: split like `DP_COMPUTE_PROTO`; the result is the list of per-rank results.
- `DP_COMPUTE_PROTO_WITH_FUNC`: like `DP_COMPUTE_PROTO`, with a function as the first argument sent to every rank.
- `RANK_ZERO`: the call runs on rank 0 only, with the arguments as given; the result is rank 0's result.

- nd-compute, `make_nd_compute_dataproto_dispatch_fn(mesh_name)`: the batch is cut into one chunk per
  data-parallel rank of a device mesh, not per worker (nd_dispatch.py).

Custom modes, as in verl: `register_dispatch_mode("my_mode", dispatch_fn, collect_fn)` adds the member
`Dispatch.MY_MODE` (`Dispatch` is a `DynamicEnum`) used as `@register(dispatch_mode=Dispatch.MY_MODE)` or by name;
`update_dispatch_mode(mode, dispatch_fn, collect_fn)` replaces a mode's pair; `dispatch_mode={"dispatch_fn": f,
"collect_fn": g}` passes a pair directly. `DISPATCH_MODE_FN_REGISTRY` (member → pair) is the one table of modes.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypedDict

from hyflow.controller.dynamic_enum import DynamicEnum
from hyflow.controller.nd_dispatch import make_nd_compute_dataproto_dispatch_fn
from hyflow.protocol import DataProto, DataProtoFuture

__all__ = [
    "DISPATCH_MODE_FN_REGISTRY",
    "PADDING_SIZE_KEY",
    "REGISTER_ATTR",
    "Dispatch",
    "DispatchMode",
    "Execute",
    "MethodSpec",
    "collect_all_to_all",
    "collect_dp_compute",
    "collect_dp_compute_data_proto",
    "dispatch_all_to_all",
    "dispatch_dp_compute",
    "dispatch_dp_compute_data_proto",
    "dispatch_one_to_all",
    "get_dispatch_mode",
    "get_predefined_dispatch_fn",
    "make_nd_compute_dataproto_dispatch_fn",
    "register",
    "register_dispatch_mode",
    "resolve_future_args",
    "update_dispatch_mode",
]

# The keyword under which a dispatch function reports the rows it padded (the group pops it before the call).
PADDING_SIZE_KEY = "_hyflow_padding_size"

# The attribute `@register` sets on a worker method; WorkerGroup looks for it to find the group's methods.
REGISTER_ATTR = "__hyflow_register__"


class Dispatch(DynamicEnum):
    """How a group call's arguments are split over the ranks and its results joined (see the module docstring).

    Built-in members: RANK_ZERO, ONE_TO_ALL, ALL_TO_ALL, DP_COMPUTE, DP_COMPUTE_PROTO, DP_COMPUTE_PROTO_WITH_FUNC,
    DP_COMPUTE_METRIC; `register_dispatch_mode` adds more.
    """

    _registry: dict[str, Dispatch] = {}
    _next_value = 0

    # The built-in members, set below by `Dispatch.register` (declared here for readers and type checkers).
    RANK_ZERO: Dispatch
    ONE_TO_ALL: Dispatch
    ALL_TO_ALL: Dispatch
    DP_COMPUTE: Dispatch
    DP_COMPUTE_PROTO: Dispatch
    DP_COMPUTE_PROTO_WITH_FUNC: Dispatch
    DP_COMPUTE_METRIC: Dispatch


for _name in (
    "RANK_ZERO",
    "ONE_TO_ALL",
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_PROTO",
    "DP_COMPUTE_PROTO_WITH_FUNC",
    "DP_COMPUTE_METRIC",
):
    Dispatch.register(_name)


class Execute(Enum):
    """Which ranks run the method: all of them, or rank 0 only (its result is returned as it is)."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


DispatchFn = Callable[..., tuple[tuple, dict]]  # (worker_group, *args, **kwargs) -> (args, kwargs), per-rank lists
CollectFn = Callable[[Any, list], Any]  # (worker_group, per-rank outputs) -> the call's result


class DispatchMode(TypedDict):
    """A dispatch function and the collect function that undoes it (verl's `{"dispatch_fn", "collect_fn"}` dict)."""

    dispatch_fn: DispatchFn
    collect_fn: CollectFn


@dataclass(frozen=True)
class MethodSpec:
    """What `@register` records on a worker method."""

    dispatch_mode: Dispatch | DispatchMode
    execute_mode: Execute
    blocking: bool
    materialize_futures: bool


# ---- the built-in dispatch / collect functions (verl's contract: the group first) ----
def _broadcast(world_size: int, value: Any) -> list:
    return [value] * world_size


def dispatch_one_to_all(worker_group: Any, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """Every rank gets every argument as it is."""
    world_size = worker_group.world_size
    return tuple(_broadcast(world_size, a) for a in args), {k: _broadcast(world_size, v) for k, v in kwargs.items()}


def dispatch_all_to_all(worker_group: Any, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """Arguments go unchanged; lists of `world_size` items are sliced one per rank when the call executes."""
    return args, dict(kwargs)


def dispatch_dp_compute(worker_group: Any, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """Every argument is already split: a list (or tuple) of `world_size` items, item r for rank r."""
    world_size = worker_group.world_size
    for name, value in [*((f"argument {i}", a) for i, a in enumerate(args)), *kwargs.items()]:
        if not (isinstance(value, (list, tuple)) and len(value) == world_size):
            raise ValueError(
                f"DP_COMPUTE needs every argument split per rank (a list of {world_size} items); {name} is "
                f"{type(value).__name__} of length {len(value) if isinstance(value, (list, tuple)) else '-'}. "
                "Split it yourself, or use DP_COMPUTE_PROTO for a DataProto."
            )
    return tuple(list(a) for a in args), {k: list(v) for k, v in kwargs.items()}


def collect_all_to_all(worker_group: Any, outputs: list) -> list:
    """The list of per-rank results, in rank order."""
    return list(outputs)


collect_dp_compute = collect_all_to_all  # verl's name for the same collect of DP_COMPUTE


def collect_rank_zero(worker_group: Any, outputs: list) -> Any:
    """Rank 0's result."""
    return outputs[0]


def _dataproto_length(args: tuple, kwargs: dict) -> int | None:
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


def dispatch_dp_compute_data_proto(worker_group: Any, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """Pad every DataProto to a multiple of `world_size` and cut it into `world_size` chunks; the padded row count
    goes under `PADDING_SIZE_KEY`.

    A `DataProtoFuture` is chunked lazily (each rank resolves it and keeps its own part); its rows must divide by
    `world_size`. Other values go to every rank.
    """
    world_size = worker_group.world_size
    length = _dataproto_length(args, kwargs)

    def shard(value: Any) -> list:
        if isinstance(value, DataProto):
            padded, _ = value.pad_to_divisor(world_size)
            return padded.chunk(world_size)
        if isinstance(value, DataProtoFuture):
            return value.chunk(world_size)
        return _broadcast(world_size, value)

    split_kwargs = {k: shard(v) for k, v in kwargs.items()}
    split_kwargs[PADDING_SIZE_KEY] = 0 if length is None else -length % world_size
    return tuple(shard(a) for a in args), split_kwargs


def dispatch_dp_compute_data_proto_with_func(worker_group: Any, func: Callable, *args: Any, **kwargs: Any) -> tuple:
    """`func` goes to every rank; the remaining arguments are split like `DP_COMPUTE_PROTO`."""
    if not callable(func):
        raise ValueError(
            f"DP_COMPUTE_PROTO_WITH_FUNC takes a function as its first argument, got {type(func).__name__}. "
            "Call it as wg.method(func, data)."
        )
    split_args, split_kwargs = dispatch_dp_compute_data_proto(worker_group, *args, **kwargs)
    return (_broadcast(worker_group.world_size, func), *split_args), split_kwargs


def collect_dp_compute_data_proto(worker_group: Any, outputs: list) -> Any:
    """Concatenate per-rank DataProtos in rank order (the group drops the padding rows after); other results come
    back as a list."""
    if not all(isinstance(out, DataProto) for out in outputs):
        return list(outputs)
    return DataProto.concat(outputs)


def _pair(dispatch_fn: DispatchFn, collect_fn: CollectFn) -> DispatchMode:
    return {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


# The one table of dispatch modes (verl's name): Dispatch member -> {"dispatch_fn", "collect_fn"}.
DISPATCH_MODE_FN_REGISTRY: dict[Dispatch, DispatchMode] = {
    Dispatch.ONE_TO_ALL: _pair(dispatch_one_to_all, collect_all_to_all),
    Dispatch.ALL_TO_ALL: _pair(dispatch_all_to_all, collect_all_to_all),
    Dispatch.DP_COMPUTE: _pair(dispatch_dp_compute, collect_dp_compute),
    Dispatch.DP_COMPUTE_PROTO: _pair(dispatch_dp_compute_data_proto, collect_dp_compute_data_proto),
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: _pair(dispatch_dp_compute_data_proto_with_func, collect_dp_compute_data_proto),
    Dispatch.DP_COMPUTE_METRIC: _pair(dispatch_dp_compute_data_proto, collect_dp_compute),
    Dispatch.RANK_ZERO: _pair(dispatch_all_to_all, collect_rank_zero),
}


def _check_pair(where: str, dispatch_fn: Any, collect_fn: Any) -> None:
    if not (callable(dispatch_fn) and callable(collect_fn)):
        raise ValueError(f"{where} needs two callables: dispatch_fn and collect_fn.")


def _check_dispatch_mode(dispatch_mode: Any) -> None:
    """A `Dispatch` member, or a dict with the keys `dispatch_fn` and `collect_fn` (else ValueError)."""
    if isinstance(dispatch_mode, dict):
        if set(dispatch_mode) != {"dispatch_fn", "collect_fn"}:
            raise ValueError(
                "a dispatch_mode dict needs exactly the keys 'dispatch_fn' and 'collect_fn', got "
                f"{sorted(dispatch_mode)}."
            )
        _check_pair("a dispatch_mode dict", dispatch_mode["dispatch_fn"], dispatch_mode["collect_fn"])
    elif not isinstance(dispatch_mode, Dispatch):
        raise ValueError(
            f"dispatch_mode must be a Dispatch member or a {{'dispatch_fn', 'collect_fn'}} dict, got "
            f"{dispatch_mode!r}. Members: {Dispatch.names()}."
        )


def register_dispatch_mode(name: str, dispatch_fn: DispatchFn, collect_fn: CollectFn) -> Dispatch:
    """Add the mode `Dispatch.<NAME>` (upper-cased, as in verl) and return it.

    `dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)` with per-rank lists (verl's contract);
    `collect_fn(worker_group, outputs) -> result`.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a custom dispatch mode needs a Python identifier as its name, got {name!r}.")
    if name in Dispatch:
        raise ValueError(f"dispatch mode {name.upper()!r} is already registered; pick another name.")
    _check_pair(f"register_dispatch_mode({name!r}, ...)", dispatch_fn, collect_fn)
    mode = Dispatch.register(name)
    DISPATCH_MODE_FN_REGISTRY[mode] = _pair(dispatch_fn, collect_fn)
    return mode


def update_dispatch_mode(mode: Dispatch | str, dispatch_fn: DispatchFn, collect_fn: CollectFn) -> None:
    """Replace the pair of an existing mode (built-in or registered), as verl's `update_dispatch_mode` does."""
    member = Dispatch.from_name(mode) if isinstance(mode, str) else mode
    if member not in DISPATCH_MODE_FN_REGISTRY:
        raise ValueError(f"update_dispatch_mode: {mode!r} is not a dispatch mode; register it first.")
    _check_pair(f"update_dispatch_mode({mode!r}, ...)", dispatch_fn, collect_fn)
    DISPATCH_MODE_FN_REGISTRY[member] = _pair(dispatch_fn, collect_fn)


def get_predefined_dispatch_fn(dispatch_mode: Dispatch) -> DispatchMode:
    """The `{"dispatch_fn", "collect_fn"}` pair of a `Dispatch` member (verl's name)."""
    return DISPATCH_MODE_FN_REGISTRY[dispatch_mode]


def get_dispatch_mode(mode: Dispatch | str | dict) -> DispatchMode:
    """The dispatch/collect pair for a `Dispatch` member, a registered name (any case), or an explicit pair."""
    if isinstance(mode, dict):
        _check_dispatch_mode(mode)
        return _pair(mode["dispatch_fn"], mode["collect_fn"])
    member = Dispatch.from_name(mode) if isinstance(mode, str) else mode
    if member in DISPATCH_MODE_FN_REGISTRY:
        return DISPATCH_MODE_FN_REGISTRY[member]
    raise ValueError(
        f"unknown dispatch_mode {mode!r}. Allowed: {[m.name for m in DISPATCH_MODE_FN_REGISTRY]}; add your own "
        "with register_dispatch_mode(name, dispatch_fn, collect_fn)."
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
