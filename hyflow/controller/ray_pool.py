"""Ray start-up and resource pools: where a worker group's processes go.

    init_ray(config.trainer.ray_init)                  # local cluster, or join RAY_ADDRESS / ray_init.address
    pool = RayResourcePool([4, 4], use_gpu=True)        # two nodes, four workers each
    pool = RayResourcePool([4], use_gpu=False)          # four CPU workers (tests, the CPU demo)

A pool makes one placement group per entry of `process_on_nodes` (STRICT_PACK: all of its bundles on one node)
with one bundle per worker, and orders the placement groups by node IP, so that ranks are laid out node by node.
Up to `max_colocate_count` worker groups (10 by default, as in verl) may share one pool: each actor takes a
1/max_colocate_count share of its bundle, so the colocated and nested patterns (an actor group, a critic group and
a reward-model group on the same devices) start without waiting for each other. A GPU bundle holds one GPU and
one logical CPU (what verl's pools reserve a GPU when its groups are fused into one process, as hyflow's are), so
a node of N GPUs needs N logical CPUs beside them. A CPU bundle holds `num_cpus_per_worker` logical CPUs (0.1 by
default, so that a few workers fit on a 2-core laptop); on a multi-node CPU cluster raise it so that each placement
group fills a node, since Ray places placement groups by free resources, not by node.

Pools can be cut and joined without new placement groups (verl's split placement): `split_resource_pool(pool,
split_size)` gives pools over consecutive slices of `pool`'s bundles (an int: equal parts; a list: those sizes),
`merge_resource_pool(a, b)` one pool over a's bundles then b's. Such views share their parent's placement groups
(the parent's `remove()` gives them back) and can be split again.

This module imports Ray; `hyflow.controller` loads it only when a Ray name is used.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

from hyflow.config.trainer import RayInitConfig

__all__ = ["Bundle", "RayResourcePool", "init_ray", "merge_resource_pool", "split_resource_pool"]

logger = logging.getLogger(__name__)


def init_ray(
    config: RayInitConfig | None = None, *, namespace: str | None = None, runtime_env: dict | None = None
) -> None:
    """Start Ray quietly, or join an existing cluster when `config.address` or `RAY_ADDRESS` is set.

    A local cluster gets an explicit `num_cpus` (the machine's core count unless `config.num_cpus` says otherwise),
    no dashboard and no usage statistics. Does nothing when Ray is already initialised.
    """
    if ray.is_initialized():
        logger.info("Ray is already initialised; using that session.")
        return
    config = config or RayInitConfig()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = config.address or os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("joining the Ray cluster at %s", address)
        ray.init(address=address, namespace=namespace, runtime_env=runtime_env)
        return
    num_cpus = config.num_cpus or os.cpu_count() or 1
    logger.info("starting a local Ray cluster with %d CPUs", num_cpus)
    ray.init(num_cpus=num_cpus, include_dashboard=False, namespace=namespace, runtime_env=runtime_env)


@dataclass(frozen=True)
class Bundle:
    """One worker's slot: a bundle of a placement group, and the node it landed on."""

    placement_group: PlacementGroup
    index: int
    node_id: str
    node_ip: str


class RayResourcePool:
    """Placement groups for `sum(process_on_nodes)` workers, `process_on_nodes[i]` of them on one node each."""

    def __init__(
        self,
        process_on_nodes: list[int] | None = None,
        use_gpu: bool = True,
        max_colocate_count: int = 10,
        num_cpus_per_worker: float = 0.1,
        name_prefix: str = "",
        detached: bool = False,
        ready_timeout_s: float = 300.0,
    ) -> None:
        process_on_nodes = [1] if process_on_nodes is None else list(process_on_nodes)
        if not process_on_nodes or any(not isinstance(n, int) or n < 1 for n in process_on_nodes):
            raise ValueError(
                f"process_on_nodes={process_on_nodes}: give a list with one positive worker count per node, e.g. "
                "[8] for one node of 8 devices or [8, 8] for two."
            )
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count={max_colocate_count}: it must be at least 1.")
        if num_cpus_per_worker <= 0:
            raise ValueError(f"num_cpus_per_worker={num_cpus_per_worker}: it must be positive, e.g. 0.1 or 1.")
        self.process_on_nodes = process_on_nodes
        self.use_gpu = use_gpu
        self.max_colocate_count = max_colocate_count
        self.num_cpus_per_worker = num_cpus_per_worker
        self.name_prefix = name_prefix
        self.detached = detached
        self.ready_timeout_s = ready_timeout_s
        self._bundles: list[Bundle] | None = None
        self._is_view = False  # a split or merged pool: its placement groups belong to another pool

    @classmethod
    def _view(cls, like: RayResourcePool, bundles: list[Bundle], name_prefix: str) -> RayResourcePool:
        """A pool over `bundles` of existing placement groups, sized like `like`."""
        per_group: dict[int, int] = {}
        for bundle in bundles:
            per_group[id(bundle.placement_group)] = per_group.get(id(bundle.placement_group), 0) + 1
        view = cls(
            list(per_group.values()),
            use_gpu=like.use_gpu,
            max_colocate_count=like.max_colocate_count,
            num_cpus_per_worker=like.num_cpus_per_worker,
            name_prefix=name_prefix,
            detached=like.detached,
            ready_timeout_s=like.ready_timeout_s,
        )
        view._bundles, view._is_view = list(bundles), True
        return view

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def bundle_resources(self) -> dict[str, float]:
        """What one bundle reserves."""
        if self.use_gpu:
            return {"CPU": 1.0, "GPU": 1.0}
        return {"CPU": self.num_cpus_per_worker}

    def actor_options(self, claim_gpu: bool = True) -> dict[str, Any]:
        """The resources one actor asks for: its share of a bundle (without the GPU share if not `claim_gpu`)."""
        share = {"num_cpus": self.bundle_resources()["CPU"] / self.max_colocate_count}
        if self.use_gpu and claim_gpu:
            share["num_gpus"] = 1.0 / self.max_colocate_count
        return share

    def bundles(self) -> list[Bundle]:
        """The workers' slots in rank order (node by node, nodes sorted by IP); placement groups are made once."""
        if self._bundles is None:
            self._bundles = self._create_bundles()
        return self._bundles

    def _create_bundles(self) -> list[Bundle]:
        lifetime = "detached" if self.detached else None
        groups = []
        for node, count in enumerate(self.process_on_nodes):
            name = f"{self.name_prefix}pg_{node}" if self.name_prefix else ""
            groups.append(
                placement_group([self.bundle_resources()] * count, strategy="STRICT_PACK", name=name, lifetime=lifetime)
            )
        for node, group in enumerate(groups):
            self._wait_ready(node, group, groups)
        node_ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        slots = []
        for group in groups:
            bundle_nodes = placement_group_table(group)["bundles_to_node_id"]
            slots.append(
                [Bundle(group, i, bundle_nodes[i], node_ips.get(bundle_nodes[i], "?")) for i in sorted(bundle_nodes)]
            )
        slots.sort(key=lambda group_slots: (group_slots[0].node_ip, group_slots[0].node_id))
        return [bundle for group_slots in slots for bundle in group_slots]

    def _wait_ready(self, node: int, group: PlacementGroup, groups: list[PlacementGroup]) -> None:
        try:
            ray.get(group.ready(), timeout=self.ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            for g in groups:
                remove_placement_group(g)
            raise ValueError(
                f"RayResourcePool(process_on_nodes={self.process_on_nodes}, use_gpu={self.use_gpu}): node {node} "
                f"needs {self.process_on_nodes[node]} bundles of {self.bundle_resources()} on one machine, and the "
                f"cluster could not provide them within {self.ready_timeout_s:g} s (it has "
                f"{ray.cluster_resources()}). Ask for fewer workers per node (trainer.n_gpus_per_node), fewer nodes "
                "(trainer.nnodes), or use_gpu=False on a machine without GPUs; or give a local Ray more logical CPUs "
                "(trainer.ray_init.num_cpus) when it has the GPUs but too few CPUs."
            ) from None

    def get_placement_groups(self, device_name: str | None = None) -> list[PlacementGroup]:
        """The pool's placement groups in rank order, made now if not yet (`device_name`: verl's signature; the
        pool's `use_gpu` decides what a bundle holds)."""
        return list({id(b.placement_group): b.placement_group for b in self.bundles()}.values())

    def remove(self) -> None:
        """Give the placement groups back to Ray (the pool's actors should be killed first)."""
        if self._is_view:
            raise ValueError(
                f"pool {self.name_prefix!r} was split from or merged out of other pools and shares their placement "
                "groups; call remove() on the pool(s) it came from."
            )
        for group in {id(b.placement_group): b.placement_group for b in self._bundles or []}.values():
            remove_placement_group(group)
        self._bundles = None


def split_resource_pool(pool: RayResourcePool, split_size: int | list[int]) -> list[RayResourcePool]:
    """Pools over consecutive slices of `pool`'s bundles: `split_size` workers each (an int dividing the world
    size), or the sizes in a list summing to it."""
    if isinstance(split_size, int) and (split_size < 1 or pool.world_size % split_size):
        raise ValueError(
            f"split_resource_pool(split_size={split_size}): an int split size must divide the pool's world size "
            f"{pool.world_size}; pass a list of sizes for uneven parts."
        )
    sizes = [split_size] * (pool.world_size // split_size) if isinstance(split_size, int) else list(split_size)
    if any(not isinstance(n, int) or n < 1 for n in sizes) or sum(sizes) != pool.world_size:
        raise ValueError(
            f"split_resource_pool(split_size={split_size}): the sizes must be positive ints summing to the pool's "
            f"world size {pool.world_size}."
        )
    bundles, start, parts = pool.bundles(), 0, []
    for index, size in enumerate(sizes):
        parts.append(RayResourcePool._view(pool, bundles[start : start + size], f"{pool.name_prefix}split_{index}_"))
        start += size
    return parts


def merge_resource_pool(first: RayResourcePool, second: RayResourcePool) -> RayResourcePool:
    """One pool over `first`'s bundles, then `second`'s (ranks in that order)."""
    for name in ("use_gpu", "max_colocate_count", "detached"):
        if getattr(first, name) != getattr(second, name):
            raise ValueError(
                f"merge_resource_pool: the pools differ in {name} ({getattr(first, name)} vs "
                f"{getattr(second, name)}); merge pools built with the same {name}."
            )
    prefix = f"{first.name_prefix}{second.name_prefix}"
    return RayResourcePool._view(first, [*first.bundles(), *second.bundles()], prefix)
