"""Placement: which roles run, in which worker processes, on which devices; builds their worker groups.

    groups = build_worker_groups(config)            # config from hyflow.config.load_config (checked)
    groups.actor_rollout.generate_sequences(batch)  # actor + rollout (+ ref) in one process per device
    groups.critic.compute_values(batch)             # same processes (colocated), when there is a critic
    groups.shutdown()

Every role shares one resource pool of `trainer.nnodes × trainer.n_gpus_per_node` processes (the colocated hybrid
engine): the role classes are fused with `create_colocated_worker_cls` and `spawn` gives one group per role over
the same processes, so the actor, the rollout engine, the reference policy, the critic and the reward model of a
rank live in one process and hand memory to each other. `trainer.backend=local` builds the same fused class in
this process (world size 1), for one device, tests and debugging; `trainer.backend=ray` starts one Ray actor per
device (CPU processes when `trainer.device=cpu`).

Hangs become errors on the Ray backend: every group call is bounded by `trainer.worker_call_timeout_s`, and
starting the workers and `init_model` by `trainer.worker_init_timeout_s`; past it the call raises
`WorkerTimeoutError` naming the ranks that did not answer, their nodes and the method, and `shutdown()` (which
`run` always reaches) kills every worker, stopped ones included. Local calls run in this process and have no limit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from hyflow.config import PPOTrainerConfig
from hyflow.config.checks import data_parallel_size
from hyflow.controller import ClassWithInitArgs, LocalWorkerGroup, WorkerGroup, create_colocated_worker_cls
from hyflow.controller.worker_group import ROLE_SEPARATOR

__all__ = [
    "ACTOR_ROLLOUT",
    "CRITIC",
    "REWARD_MODEL",
    "WorkerGroups",
    "build_worker_groups",
    "role_classes",
]

logger = logging.getLogger(__name__)

ACTOR_ROLLOUT, CRITIC, REWARD_MODEL = "actor_rollout", "critic", "reward_model"


@dataclass
class WorkerGroups:
    """The role groups of one run; `critic` / `reward_model` are None when the config has no such role."""

    actor_rollout: WorkerGroup
    critic: WorkerGroup | None = None
    reward_model: WorkerGroup | None = None
    world_size: int = 1
    backend: str = "local"
    _fused: WorkerGroup | None = field(default=None, repr=False)
    _pool: Any = field(default=None, repr=False)
    _owns_process_group: bool = field(default=False, repr=False)  # local: the workers started torch.distributed

    def local_role(self, role: str) -> Any:
        """The role object itself on the local backend (e.g. to drive its engine from this process)."""
        if not isinstance(self._fused, LocalWorkerGroup):
            raise ValueError(
                f"the {role} role object lives in a Ray worker process; only trainer.backend=local exposes it here."
            )
        return self._fused.worker.roles[role]

    def rollout_servers(self) -> list[Any]:
        """One async generation server per rollout worker, for the agent loops: the engine in this process on the
        local backend, each worker's async `generate_request` reached through Ray on the Ray backend."""
        from hyflow.agent.server import LocalEngineServer, WorkerServer

        if isinstance(self._fused, LocalWorkerGroup):
            return [LocalEngineServer(self.local_role(ACTOR_ROLLOUT).rollout)]
        method = f"{ACTOR_ROLLOUT}{ROLE_SEPARATOR}generate_request"  # the colocated worker's forwarding method
        group = self._fused
        return [
            WorkerServer(handle, method, timeout_s=group.timeout_s, rank=rank, node=group.node_of(rank))
            for rank, handle in enumerate(group.workers)
        ]

    def shutdown(self) -> None:
        """End the Ray workers and give their placement groups back; on the local backend, leave the
        torch.distributed group the in-process workers joined, so this process is as it was before."""
        if self.backend == "ray" and self._fused is not None:
            self._fused.kill()
            if self._pool is not None:
                self._pool.remove()
        elif self.backend == "local" and self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()


def role_classes(config: PPOTrainerConfig) -> dict[str, ClassWithInitArgs]:
    """Role name → worker class with its init arguments, for the roles this config needs."""
    from hyflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    roles = {
        ACTOR_ROLLOUT: ClassWithInitArgs(
            ActorRolloutRefWorker, config.actor_rollout_ref, actor=True, rollout=True, ref=config.use_reference_policy
        )
    }
    if config.use_critic:
        from hyflow.workers.critic_worker import CriticWorker

        roles[CRITIC] = ClassWithInitArgs(CriticWorker, config.critic, rollout_n=config.actor_rollout_ref.rollout.n)
    if config.reward_model.enable:
        from hyflow.workers.reward_model import RewardModelWorker

        roles[REWARD_MODEL] = ClassWithInitArgs(RewardModelWorker, config.reward_model)
    return roles


def _ray_group(config: PPOTrainerConfig, fused: ClassWithInitArgs) -> tuple[WorkerGroup, Any]:
    from hyflow.controller import RayResourcePool, RayWorkerGroup, init_ray

    init_ray(config.trainer.ray_init)
    use_gpu = config.trainer.device == "cuda"
    nodes = [config.trainer.n_gpus_per_node] * config.trainer.nnodes
    pool = RayResourcePool(nodes, use_gpu=use_gpu, name_prefix=f"{config.trainer.experiment_name}_")
    name_prefix, trainer = f"hyflow_{config.trainer.experiment_name}", config.trainer
    try:
        group = RayWorkerGroup(
            pool,
            fused,
            name_prefix=name_prefix,
            timeout_s=trainer.worker_call_timeout_s,
            init_timeout_s=trainer.worker_init_timeout_s,
        )
    except BaseException:
        pool.remove()
        raise
    return group, pool


def build_worker_groups(config: PPOTrainerConfig) -> WorkerGroups:
    """Start the workers of every role (colocated, one process per device) and load their models."""
    roles = role_classes(config)
    fused = create_colocated_worker_cls(roles)
    backend = config.trainer.backend
    owns_process_group = backend == "local" and not dist.is_initialized()
    if backend == "local":
        fused_group, pool = LocalWorkerGroup(fused), None
    else:
        fused_group, pool = _ray_group(config, fused)
    groups = fused_group.spawn(prefix_set=list(roles))
    logger.info("placement: roles %s on %d %s worker(s)", list(roles), fused_group.world_size, backend)
    workers = WorkerGroups(
        actor_rollout=groups[ACTOR_ROLLOUT],
        critic=groups.get(CRITIC),
        reward_model=groups.get(REWARD_MODEL),
        world_size=data_parallel_size(config),
        backend=backend,
        _fused=fused_group,
        _pool=pool,
        _owns_process_group=owns_process_group,
    )
    try:
        for role in (CRITIC, REWARD_MODEL, ACTOR_ROLLOUT):  # the actor last: its engine sizes the KV cache on the rest
            if role in groups:
                groups[role].init_model(timeout=config.trainer.worker_init_timeout_s)
    except BaseException:  # the caller never gets the groups: end the workers here, so nothing is left running
        workers.shutdown()
        raise
    return workers
