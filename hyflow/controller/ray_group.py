"""`RayWorkerGroup`: one Ray actor per bundle of a `RayResourcePool`, behind the `WorkerGroup` API.

    init_ray()
    pool = RayResourcePool([4], use_gpu=False)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(MyWorker, config=cfg))
    wg.my_method(data)                              # dispatch → MyWorker.my_method on 4 actors → collect

Rank r's actor is named `<name_prefix>_rank<r>` and starts with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT in its environment (and verl's RAY_LOCAL_WORLD_SIZE, WG_PREFIX, WG_BACKEND), plus the
group's `worker_env`. The rendezvous address (rank 0's node and a free port there) is
picked by a small task on that node before any actor starts, so every actor starts at once and a worker may join
`torch.distributed` inside its `__init__`, as in verl. A new
group can attach to running actors by name: `RayWorkerGroup.from_detached(name_prefix=..., ray_cls_with_init=...)`.

Failures are turned into the errors of errors.py: a worker that raises → `WorkerError` with the rank, the method
and the worker's traceback; a worker whose process dies → `WorkerDiedError` naming the rank and its node, as soon
as Ray notices (the other ranks are not waited for); a call past its timeout → `WorkerTimeoutError` naming every
rank that had not answered and its node. `timeout_s` bounds every call (None: wait forever; `timeout=` on one call
overrides it); `init_timeout_s` bounds starting the actors (their `__init__`), defaulting to `timeout_s`. A hung
worker (e.g. a stopped process) is then ended with `kill()`, which Ray does with SIGKILL when the actor cannot exit.

This module imports Ray; `hyflow.controller` loads it only when a Ray name is used.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from hyflow.controller.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from hyflow.controller.ray_pool import Bundle, RayResourcePool
from hyflow.controller.worker import free_port, node_ip_address
from hyflow.controller.worker_group import ClassWithInitArgs, WorkerGroup

__all__ = ["RayWorkerGroup"]

logger = logging.getLogger(__name__)

RANK_TAG = "_rank"
ANSI_COLOR = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the first line of remote tracebacks


# The env vars a group sets on each worker (`_rank_env`); `worker_env` may add others, never replace these.
GROUP_ENV_KEYS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "RAY_LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WG_PREFIX",
    "WG_BACKEND",
)
DEVICE_NAMES = ("cuda", "cpu")


def _rank_env(bundles: list[Bundle], rank: int, master: tuple[str, int], prefix: str) -> dict[str, str]:
    """The distributed env vars of rank `rank`; LOCAL_* (and verl's RAY_LOCAL_WORLD_SIZE) count the ranks on the same
    node; WG_PREFIX / WG_BACKEND name the group, as verl's workers read them."""
    same_node = [r for r, b in enumerate(bundles) if b.node_id == bundles[rank].node_id]
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(len(bundles)),
        "LOCAL_RANK": str(same_node.index(rank)),
        "LOCAL_WORLD_SIZE": str(len(same_node)),
        "RAY_LOCAL_WORLD_SIZE": str(len(same_node)),
        "MASTER_ADDR": master[0],
        "MASTER_PORT": str(master[1]),
        "WG_PREFIX": prefix,
        "WG_BACKEND": "ray",
    }


def _check_worker_env(worker_env: dict[str, str]) -> dict[str, str]:
    clash = sorted(set(worker_env) & set(GROUP_ENV_KEYS))
    if clash:
        raise ValueError(
            f"RayWorkerGroup(worker_env=...) sets {clash}, which the group sets itself on every worker "
            f"({', '.join(GROUP_ENV_KEYS)}). Drop them from worker_env; the group's layout decides them."
        )
    return {str(key): str(value) for key, value in worker_env.items()}


def _device_name(device_name: str | None, pool: RayResourcePool) -> str:
    """`device_name` checked against the pool: None picks "cuda" for a GPU pool and "cpu" otherwise."""
    if device_name is None:
        return "cuda" if pool.use_gpu else "cpu"
    if device_name not in DEVICE_NAMES:
        raise ValueError(f"RayWorkerGroup(device_name={device_name!r}): allowed values are {list(DEVICE_NAMES)}.")
    if device_name == "cuda" and not pool.use_gpu:
        raise ValueError(
            "RayWorkerGroup(device_name='cuda') on a pool without GPUs (RayResourcePool(..., use_gpu=False)); "
            "build the pool with use_gpu=True or pass device_name='cpu'."
        )
    return device_name


@ray.remote(num_cpus=0)
def _pick_rendezvous() -> tuple[str, int]:
    """(IP, free port) of the node this runs on: rank 0's `torch.distributed` rendezvous."""
    return node_ip_address(), free_port()


class RayWorkerGroup(WorkerGroup):
    """Ray actors of one worker class (or a colocated class), one per bundle of a resource pool."""

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: ClassWithInitArgs | None = None,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: list[str] | None = None,
        timeout_s: float | None = None,
        init_timeout_s: float | None = None,
        device_name: str | None = None,
        worker_env: dict[str, str] | None = None,
    ) -> None:
        """Create the actors on `resource_pool`, or attach to the running actors named in `worker_names`.

        `device_name` ("cuda" or "cpu"; None: the pool's) says whether each actor claims its share of a GPU;
        `worker_env` adds env vars to every worker (the group's own, `GROUP_ENV_KEYS`, cannot be replaced).
        """
        if ray_cls_with_init is None:
            raise ValueError("RayWorkerGroup needs ray_cls_with_init=RayClassWithInitArgs(WorkerClass, *args, ...).")
        if not isinstance(ray_cls_with_init, ClassWithInitArgs):
            ray_cls_with_init = ClassWithInitArgs(ray_cls_with_init)
        super().__init__(ray_cls_with_init.cls, timeout_s=timeout_s)
        if not ray.is_initialized():
            raise RuntimeError("Ray is not initialised; call hyflow.controller.init_ray() before building a group.")
        self._init_timeout_s = timeout_s if init_timeout_s is None else init_timeout_s
        self.name_prefix = name_prefix or f"{ray_cls_with_init.cls.__name__}_{uuid.uuid4().hex[:8]}"
        self.worker_env = _check_worker_env(worker_env or {})
        self.device_name = device_name
        if worker_names is not None:
            self.worker_names = list(worker_names)
            self.workers = [ray.get_actor(name) for name in self.worker_names]
            self._nodes = ["unknown"] * len(self.workers)
        elif resource_pool is not None:
            self.device_name = _device_name(device_name, resource_pool)
            self.workers = self._create_workers(resource_pool, ray_cls_with_init, detached)
        else:
            raise ValueError("RayWorkerGroup needs a resource_pool to create workers, or worker_names to attach to.")
        try:
            infos = self._wait([w.get_node_info.remote() for w in self.workers], "__init__", self._init_timeout_s)
        except BaseException:
            if worker_names is None:  # ours: a group that failed to start leaves no actor running
                self.kill()
            raise
        self._nodes = [f"{info['ip']} ({info['hostname']})" for info in infos]
        self.worker_pids = [int(info["pid"]) for info in infos]
        self._bind_worker_methods(ray_cls_with_init.cls)

    @classmethod
    def from_detached(
        cls,
        name_prefix: str,
        ray_cls_with_init: ClassWithInitArgs,
        worker_names: list[str] | None = None,
        timeout_s: float | None = None,
    ) -> RayWorkerGroup:
        """A group over running actors: those named `worker_names`, or all named `<name_prefix>_rank<r>`."""
        if worker_names is None:
            prefix = f"{name_prefix}{RANK_TAG}"
            found = [name for name in ray.util.list_named_actors() if name.startswith(prefix)]
            if not found:
                raise ValueError(
                    f"no running actors are named {prefix}<r> in this Ray namespace. Check name_prefix, and that the "
                    "group was created with detached=True in the same namespace (init_ray(namespace=...))."
                )
            worker_names = sorted(found, key=lambda name: int(name.removeprefix(prefix)))
        return cls(
            ray_cls_with_init=ray_cls_with_init, name_prefix=name_prefix, worker_names=worker_names, timeout_s=timeout_s
        )

    def _create_workers(self, pool: RayResourcePool, cls_with_init: ClassWithInitArgs, detached: bool) -> list:
        bundles = pool.bundles()
        self._nodes = [b.node_ip for b in bundles]
        self.worker_names = [f"{self.name_prefix}{RANK_TAG}{rank}" for rank in range(len(bundles))]
        remote_cls = ray.remote(cls_with_init.cls)
        user_options = dict(cls_with_init.options)
        user_env = dict(user_options.pop("runtime_env", None) or {})
        strategy = NodeAffinitySchedulingStrategy(node_id=bundles[0].node_id, soft=False)
        master_ref = _pick_rendezvous.options(scheduling_strategy=strategy).remote()
        master = tuple(self._wait([master_ref], "__init__ (picking rank 0's rendezvous port)", self._init_timeout_s)[0])
        workers: list = []
        prefix = self.name_prefix
        for rank, bundle in enumerate(bundles):
            env_vars = {**user_env.get("env_vars", {}), **self.worker_env, **_rank_env(bundles, rank, master, prefix)}
            options = {
                **pool.actor_options(claim_gpu=self.device_name == "cuda"),
                **user_options,
                "name": self.worker_names[rank],
                "runtime_env": {**user_env, "env_vars": env_vars},
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    bundle.placement_group, placement_group_bundle_index=bundle.index
                ),
            }
            if detached:
                options["lifetime"] = "detached"
            workers.append(remote_cls.options(**options).remote(*cls_with_init.args, **cls_with_init.kwargs))
        logger.info("started %d %s workers (%s)", len(workers), cls_with_init.cls.__name__, self.name_prefix)
        return workers

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def node_of(self, rank: int) -> str:
        """Where rank `rank` runs, as errors name it: "<ip> (<hostname>)"."""
        return self._nodes[rank]

    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> ray.ObjectRef:
        return getattr(self.workers[rank], method_name).remote(*args, **kwargs)

    def _wait(self, handles: list, method_name: str, timeout_s: float | None) -> list:
        """Results in rank order; the first rank to fail (not the lowest) raises, so a dead rank never hangs us."""
        rank_of = {ref: rank for rank, ref in enumerate(handles)}
        results: list[Any] = [None] * len(handles)
        pending = list(handles)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
            if not ready:
                silent = sorted(rank_of[ref] for ref in pending)
                nodes = [self._nodes[rank] for rank in silent]
                raise WorkerTimeoutError(
                    ranks=silent, method=method_name, timeout_s=timeout_s, nodes=nodes, world_size=len(self._nodes)
                )
            for ref in ready:
                results[rank_of[ref]] = self._get_one(ref, rank_of[ref], method_name)
        return results

    def _get_one(self, ref: ray.ObjectRef, rank: int, method_name: str) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as error:
            cause = getattr(error, "cause", None)
            raise WorkerError(
                rank=rank,
                method=method_name,
                remote_traceback=ANSI_COLOR.sub("", getattr(error, "traceback_str", str(error))),
                cause_type=type(cause).__name__ if cause is not None else "",
            ) from None
        except ray.exceptions.RayActorError as error:
            if getattr(error, "actor_init_failed", False):  # the worker's __init__ raised: report it as such
                raise WorkerError(
                    rank=rank, method="__init__", remote_traceback=ANSI_COLOR.sub("", getattr(error, "error_msg", ""))
                ) from None
            raise WorkerDiedError(rank=rank, method=method_name, node=self._nodes[rank], detail=str(error)) from None

    def kill(self) -> None:
        """End every worker process of this group (detached ones included)."""
        for worker in self.workers:
            ray.kill(worker)
