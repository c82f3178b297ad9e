"""Colocated roles: several worker classes fused into one worker class, so they share one process per device.

    fused = create_colocated_worker_cls({"actor_rollout": actor_cls_with_init, "critic": critic_cls_with_init})
    wg = RayWorkerGroup(resource_pool, fused)          # or LocalWorkerGroup(fused)
    groups = wg.spawn(prefix_set={"actor_rollout", "critic"})
    groups["critic"].compute_values(batch)             # runs CriticWorker.compute_values in the shared process

The fused class builds every role object in its `__init__` (same process, same env vars) and has one forwarding
method per registered role method, named `<role>__<method>` and carrying the role method's `@register` spec;
`WorkerGroup.spawn` binds each role's forwarding methods under their plain names. The call path stays two hops:
fused method → role object's method.

Inside the process each role object is an attribute of the fused worker (`self.actor`, `self.critic`, also in
`self.roles`) and sees the others through its `fused_worker_dict`. To add methods that use several roles at once,
subclass the raw fused class (verl's fused-worker pattern) and call `fuse` on the group:

    class Hybrid(create_colocated_worker_raw_cls({"actor": actor_cls, "critic": critic_cls})):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def step(self, x):
            return self.critic.sub(self.actor.add(x))

    wg = RayWorkerGroup(pool, RayClassWithInitArgs(Hybrid))
    wg.fuse(["actor", "critic"])          # wg.actor.add(...), wg.critic.sub(...), wg.step(...)

verl builds colocated workers two ways (`create_colocated_worker_cls` and `create_colocated_worker_cls_fused`);
both give the same groups through `spawn`, so hyflow has one mechanism under both names.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from hyflow.controller.decorator import REGISTER_ATTR
from hyflow.controller.worker import Worker
from hyflow.controller.worker_group import ROLE_SEPARATOR, ClassWithInitArgs, registered_methods

__all__ = ["create_colocated_worker_cls", "create_colocated_worker_cls_fused", "create_colocated_worker_raw_cls"]

# The attribute through which each role object of a fused worker sees all of them (verl's name).
FUSED_WORKER_ATTR = "fused_worker_dict"


def _forwarder(role: str, name: str, role_method: Callable) -> Callable:
    """A method of the fused class that calls `self.roles[role].<name>` (futures are resolved by the role method)."""
    if inspect.iscoroutinefunction(role_method):

        async def forward_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self.roles[role], name)(*args, **kwargs)

        forward = forward_async
    else:

        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.roles[role], name)(*args, **kwargs)

    functools.update_wrapper(forward, role_method)
    forward.__name__ = f"{role}{ROLE_SEPARATOR}{name}"
    setattr(forward, REGISTER_ATTR, getattr(role_method, REGISTER_ATTR))
    return forward


def _parts(class_dict: dict[str, ClassWithInitArgs | type]) -> dict[str, ClassWithInitArgs]:
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role, e.g. {'actor': ActorWorker}.")
    parts = {role: c if isinstance(c, ClassWithInitArgs) else ClassWithInitArgs(c) for role, c in class_dict.items()}
    for role in parts:
        if not role.isidentifier() or ROLE_SEPARATOR in role:
            raise ValueError(
                f"role name {role!r} must be a Python identifier without {ROLE_SEPARATOR!r} (it prefixes method "
                "names), e.g. 'actor_rollout' or 'critic'."
            )
        if hasattr(Worker, role) or role == "roles":
            raise ValueError(
                f"role name {role!r} is an attribute of every worker (the role object becomes `self.{role}`); "
                "pick another name, e.g. 'actor_rollout' or 'critic'."
            )
    return parts


def create_colocated_worker_raw_cls(class_dict: dict[str, ClassWithInitArgs | type]) -> type:
    """The fused worker class itself (role name → class, or `ClassWithInitArgs`), to subclass or to wrap."""
    parts = _parts(class_dict)

    def __init__(self: Any) -> None:
        self.roles = {role: part() for role, part in parts.items()}
        for role, role_object in self.roles.items():
            setattr(self, role, role_object)
            setattr(role_object, FUSED_WORKER_ATTR, self.roles)

    namespace: dict[str, Any] = {
        "__init__": __init__,
        "__doc__": f"Colocated worker holding the roles {list(parts)} in one process.",
        "colocated_roles": {role: part.cls for role, part in parts.items()},
    }
    for role, part in parts.items():
        for name in registered_methods(part.cls):
            namespace[f"{role}{ROLE_SEPARATOR}{name}"] = _forwarder(role, name, getattr(part.cls, name))
    fused_name = "Colocated_" + "_".join(part.cls.__name__ for part in parts.values())
    fused_cls = type(fused_name, (Worker,), namespace)
    fused_cls._role_options = [part.options for part in parts.values()]
    return fused_cls


def create_colocated_worker_cls(class_dict: dict[str, ClassWithInitArgs | type]) -> ClassWithInitArgs:
    """Fuse worker classes (role name → class, or `ClassWithInitArgs`) into one worker class.

    Returns a `ClassWithInitArgs` for `RayWorkerGroup` or `LocalWorkerGroup`; Ray options of the parts are merged.
    """
    fused_cls = create_colocated_worker_raw_cls(class_dict)
    fused = ClassWithInitArgs(fused_cls)
    for options in fused_cls._role_options:
        fused.update_options(options)
    return fused


create_colocated_worker_cls_fused = create_colocated_worker_cls  # verl's second name for the same colocation
