"""`Worker`: the base class of every process a worker group runs (one per device).

A worker group starts each worker with the distributed environment in its process environment:

    RANK, WORLD_SIZE            this worker's place among all the group's workers
    LOCAL_RANK, LOCAL_WORLD_SIZE its place among the group's workers on the same node
    MASTER_ADDR, MASTER_PORT    where rank 0 listens for torch.distributed's rendezvous

`Worker` reads them when the object is created (in `__new__`, so subclasses need not call `super().__init__`)
and exposes `rank`, `world_size`, `local_rank`, `local_world_size`. `init_distributed()` starts
`torch.distributed` from them: NCCL when CUDA is available, gloo otherwise.

The Ray group picks the rendezvous address on rank 0's node before it starts any worker, so a worker may call
`init_distributed()` (or `torch.distributed.init_process_group()`) inside its `__init__`. A rank 0 that finds no
`MASTER_ADDR` (a process started outside a group, the local backend) picks its own IP and a free port.

For nd-compute dispatch (nd_dispatch.py) a worker records, per mesh name, its data-parallel rank and whether its
result is collected (`_register_dispatch_collect_info`); the group asks for them with the registered methods
`_query_dispatch_info` / `_query_collect_info`. A worker holding several roles copies a role's record under a mesh
name of its own (`set_dispatch_collect(mesh_name, **role.get_dispatch_collect())`).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hyflow.controller.decorator import Dispatch, Execute, register
from hyflow.controller.errors import ControllerUsageError

__all__ = ["DistEnv", "Worker"]

logger = logging.getLogger(__name__)

DIST_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def node_ip_address() -> str:
    """This machine's IP as the cluster sees it (Ray's view when Ray is loaded, else the default route's)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent; this only picks the outgoing interface
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class DistEnv:
    """The distributed environment a worker was started with."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    @staticmethod
    def from_environ() -> DistEnv:
        """Read the env vars; a process started outside a group is rank 0 of 1 and picks its own address."""
        env = os.environ
        rank = int(env.get("RANK", "0"))
        if rank == 0 and not env.get("MASTER_ADDR"):  # the group sends rank 0 an empty address: pick one
            env["MASTER_ADDR"] = node_ip_address()
            env["MASTER_PORT"] = str(free_port())
        if not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
            raise RuntimeError(
                f"worker rank {rank} started without MASTER_ADDR/MASTER_PORT; the worker group sets them from "
                "rank 0. Create workers through a WorkerGroup, or set both env vars yourself."
            )
        return DistEnv(
            rank=rank,
            world_size=int(env.get("WORLD_SIZE", "1")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")),
            master_addr=env["MASTER_ADDR"],
            master_port=int(env["MASTER_PORT"]),
        )


class Worker:
    """Base class of worker processes: knows its rank and can start `torch.distributed`.

    Subclass it, mark the methods the controller calls with `@register(...)`, and build a group from it.
    """

    def __new__(cls, *args: object, **kwargs: object) -> Worker:
        instance = super().__new__(cls)
        instance._dist_env = DistEnv.from_environ()
        instance._dispatch_dp_rank: dict[str, int] = {}
        instance._collect_dp_rank: dict[str, bool] = {}
        return instance

    def __init__(self, cuda_visible_devices: str | None = None) -> None:
        """Takes verl's `cuda_visible_devices` argument, which changes nothing here: Ray and the group set each
        worker's visible devices before it starts (the state lives in `__new__`)."""

    @property
    def rank(self) -> int:
        return self._dist_env.rank

    @property
    def world_size(self) -> int:
        return self._dist_env.world_size

    @property
    def local_rank(self) -> int:
        return self._dist_env.local_rank

    @property
    def local_world_size(self) -> int:
        return self._dist_env.local_world_size

    def init_distributed(self, backend: str | None = None, timeout_s: float = 1800.0) -> None:
        """Join this group's `torch.distributed` process group (once; later calls do nothing).

        `backend=None` picks NCCL when CUDA is available and gloo otherwise.
        """
        if dist.is_initialized():
            return
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            # Ray shows each GPU worker only its own device(s); index by local rank when it sees them all.
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
        env = self._dist_env
        logger.info("rank %d/%d joins %s at %s:%d", env.rank, env.world_size, backend, env.master_addr, env.master_port)
        timeout = datetime.timedelta(seconds=timeout_s)
        if env.world_size == 1:
            # A world of one needs no rendezvous: an in-process store cannot lose its port to another process.
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
            return
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{env.master_addr}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
        )

    # ---- nd-compute dispatch: this worker's place in each named device mesh ----
    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Record this worker's data-parallel rank in `mesh_name` and whether the group collects its result."""
        if mesh_name in self._dispatch_dp_rank:
            raise ControllerUsageError(
                f"{type(self).__name__} rank {self.rank}: mesh {mesh_name!r} is registered already (dp rank "
                f"{self._dispatch_dp_rank[mesh_name]}); register each mesh name once."
            )
        self._dispatch_dp_rank[mesh_name] = int(dp_rank)
        self._collect_dp_rank[mesh_name] = bool(is_collect)

    def _mesh_record(self, table: dict[str, Any], mesh_name: str) -> Any:
        if mesh_name not in table:
            raise ControllerUsageError(
                f"{type(self).__name__} rank {self.rank} has no mesh {mesh_name!r} (registered: {sorted(table)}). "
                "Call self._register_dispatch_collect_info(mesh_name=..., dp_rank=..., is_collect=...) in __init__."
            )
        return table[mesh_name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        """This worker's dp rank in `mesh_name` (the group gets one per worker)."""
        return self._mesh_record(self._dispatch_dp_rank, mesh_name)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        """Whether the group collects this worker's result for `mesh_name`."""
        return self.query_collect_info(mesh_name)

    def query_collect_info(self, mesh_name: str) -> bool:
        return self._mesh_record(self._collect_dp_rank, mesh_name)

    def get_dispatch_collect(self) -> dict[str, dict]:
        """Every mesh record: `{"dispatch_dp_rank": {mesh: dp_rank}, "collect_dp_rank": {mesh: is_collect}}`."""
        return {"dispatch_dp_rank": dict(self._dispatch_dp_rank), "collect_dp_rank": dict(self._collect_dp_rank)}

    def set_dispatch_collect(
        self, mesh_name: str, dispatch_dp_rank: dict[str, int], collect_dp_rank: dict[str, bool]
    ) -> None:
        """Register under `mesh_name` the one mesh record of another worker (its `get_dispatch_collect()`)."""
        if len(dispatch_dp_rank) != 1 or len(collect_dp_rank) != 1:
            raise ControllerUsageError(
                f"set_dispatch_collect({mesh_name!r}, ...) takes the record of one mesh, got meshes "
                f"{sorted(dispatch_dp_rank)}; copy them one at a time."
            )
        (dp_rank,), (is_collect,) = dispatch_dp_rank.values(), collect_dp_rank.values()
        self._register_dispatch_collect_info(mesh_name, dp_rank, is_collect)

    # ---- running a controller-side function on the workers (verl's driver functions) ----
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`func(worker, shard, ...)` on every rank, each with its shard of the DataProto arguments; results joined."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`func(*args, **kwargs)` in rank 0's process; its result."""
        return func(*args, **kwargs)

    # ---- called by the worker group itself (not group methods) ----
    def get_master_addr_port(self) -> tuple[str, int]:
        """Rank 0's rendezvous address, which the group passes on to the other ranks."""
        return self._dist_env.master_addr, self._dist_env.master_port

    def get_node_info(self) -> dict[str, object]:
        """Where this worker runs: node IP, host name, Ray node id (when on Ray) and pid (for errors and tests)."""
        ray = sys.modules.get("ray")
        node_id = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else ""
        return {"ip": node_ip_address(), "hostname": socket.gethostname(), "node_id": node_id, "pid": os.getpid()}

    def get_dist_env(self) -> dict[str, str]:
        """The distributed env vars this worker sees (for checks and tests)."""
        return {key: os.environ.get(key, "") for key in DIST_ENV_KEYS}
