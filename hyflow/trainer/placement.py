"""Placement: which roles run, in which worker processes, on which devices; builds their worker groups.

    groups = build_worker_groups(config)            # config from hyflow.config.load_config (checked)
    groups.actor_rollout.generate_sequences(batch)  # actor + rollout (+ ref) in one process per device
    groups.critic.compute_values(batch)             # same processes (colocated), when there is a critic
    groups.shutdown()

Every role shares one resource pool of `trainer.nnodes × trainer.n_gpus_per_node` processes (the colocated hybrid
engine): the role classes are fused with `create_colocated_worker_cls` and `spawn` gives one group per role over
the same processes, so the actor, the rollout engine, the reference policy, the critic, the reward model and the
distillation teacher of a rank live in one process and hand memory to each other. `trainer.backend=local` builds
the same fused class in this process (world size 1), for one device, tests and debugging; `trainer.backend=ray`
starts one Ray actor per device (CPU processes when `trainer.device=cpu`).

Split placement (`trainer.placement=split`) gives generation a pool of its own, `trainer.rollout_nnodes ×
trainer.rollout_n_gpus_per_node` processes of a rollout-only `ActorRolloutRefWorker` (group `rollout`), beside the
training pool, whose fused workers then hold the actor without an engine (plus ref, critic, reward model). The
weights travel between the pools over a `WeightChannel` (`hyflow.trainer.async_rollout.PoolWeightSync`). With
`trainer.rollout_shares_devices` the rollout processes are placed on the training pool's devices instead (one
beside each training process, e.g. both on one GPU: generation and updates still overlap, sharing the device). In
the colocated placement `rollout` is the `actor_rollout` group itself.

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
from hyflow.trainer.shutdown import reclaim_sigterm

__all__ = [
    "ACTOR_ROLLOUT",
    "CRITIC",
    "REWARD_MODEL",
    "ROLLOUT",
    "TEACHER",
    "WorkerGroups",
    "build_worker_groups",
    "role_classes",
]

logger = logging.getLogger(__name__)

ACTOR_ROLLOUT, CRITIC, REWARD_MODEL, ROLLOUT = "actor_rollout", "critic", "reward_model", "rollout"
TEACHER = "teacher"  # on-policy distillation's teacher (distillation.enabled)


@dataclass
class WorkerGroups:
    """The role groups of one run; `critic` / `reward_model` / `teacher` are None when the config has no such role;
    `rollout` is the group that generates (`actor_rollout` itself unless the placement is split)."""

    actor_rollout: WorkerGroup
    critic: WorkerGroup | None = None
    reward_model: WorkerGroup | None = None
    world_size: int = 1
    backend: str = "local"
    rollout: WorkerGroup | None = None
    teacher: WorkerGroup | None = None
    _fused: WorkerGroup | None = field(default=None, repr=False)
    _pool: Any = field(default=None, repr=False)
    _rollout_fused: WorkerGroup | None = field(default=None, repr=False)  # split placement: the rollout pool's
    _rollout_pool: Any = field(default=None, repr=False)
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
        role, group = (
            (ROLLOUT, self._rollout_fused) if self._rollout_fused is not None else (ACTOR_ROLLOUT, self._fused)
        )
        method = f"{role}{ROLE_SEPARATOR}generate_request"  # the colocated worker's forwarding method
        return [
            WorkerServer(handle, method, timeout_s=group.timeout_s, rank=rank, node=group.node_of(rank))
            for rank, handle in enumerate(group.workers)
        ]

    def shutdown(self) -> None:
        """End the Ray workers and give their placement groups back; on the local backend, leave the
        torch.distributed group the in-process workers joined, so this process is as it was before."""
        if self.backend == "ray":
            for group, pool in ((self._rollout_fused, self._rollout_pool), (self._fused, self._pool)):
                if group is not None:
                    group.kill()
                if pool is not None:
                    pool.remove()
        elif self.backend == "local" and self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()


def role_classes(config: PPOTrainerConfig) -> dict[str, ClassWithInitArgs]:
    """Role name → worker class with its init arguments, for the roles this config needs on the training pool
    (with split placement its actor has no engine: see `rollout_role_classes`)."""
    from hyflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    engine = config.trainer.placement == "colocated"
    roles = {
        ACTOR_ROLLOUT: ClassWithInitArgs(
            ActorRolloutRefWorker, config.actor_rollout_ref, actor=True, rollout=engine, ref=config.use_reference_policy
        )
    }
    if config.use_critic:
        from hyflow.workers.critic_worker import CriticWorker

        roles[CRITIC] = ClassWithInitArgs(CriticWorker, config.critic, rollout_n=config.actor_rollout_ref.rollout.n)
    if config.reward_model.enable:
        from hyflow.workers.reward_model import RewardModelWorker

        roles[REWARD_MODEL] = ClassWithInitArgs(RewardModelWorker, config.reward_model)
    if config.distillation.enabled:
        from hyflow.workers.teacher import TeacherWorker

        roles[TEACHER] = ClassWithInitArgs(TeacherWorker, config.actor_rollout_ref, config.distillation.teacher_path)
    return roles


def rollout_role_classes(config: PPOTrainerConfig) -> dict[str, ClassWithInitArgs]:
    """Split placement: the rollout pool's one role, an engine without actor or ref."""
    from hyflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    worker = ClassWithInitArgs(ActorRolloutRefWorker, config.actor_rollout_ref, actor=False, rollout=True, ref=False)
    return {ROLLOUT: worker}


def _ray_group(
    config: PPOTrainerConfig, fused: ClassWithInitArgs, pool_name: str = "", on: Any = None
) -> tuple[WorkerGroup, Any]:
    """A Ray group of `fused` on a new pool: the training pool, or (`pool_name="rollout"`) the rollout pool; with
    `on`, on that existing pool's devices instead (returned pool: None, it is not this group's to remove)."""
    from hyflow.controller import RayResourcePool, RayWorkerGroup, init_ray

    init_ray(config.trainer.ray_init)
    reclaim_sigterm()  # ray.init installed its own SIGTERM handler (a bare sys.exit); a stop ends through ours
    trainer = config.trainer
    use_gpu = trainer.device == "cuda"
    if pool_name == ROLLOUT:
        nodes = [trainer.rollout_n_gpus_per_node] * trainer.rollout_nnodes
    else:
        nodes = [trainer.n_gpus_per_node] * trainer.nnodes
    tag = f"{trainer.experiment_name}_{pool_name}" if pool_name else trainer.experiment_name
    pool = on if on is not None else RayResourcePool(nodes, use_gpu=use_gpu, name_prefix=f"{tag}_")
    name_prefix = f"hyflow_{tag}"
    try:
        group = RayWorkerGroup(
            pool,
            fused,
            name_prefix=name_prefix,
            timeout_s=trainer.worker_call_timeout_s,
            init_timeout_s=trainer.worker_init_timeout_s,
        )
    except BaseException:
        if on is None:
            pool.remove()
        raise
    return group, None if on is not None else pool


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
    rollout_fused, rollout_pool = None, None
    if config.trainer.placement == "split":
        try:
            rollout_roles = rollout_role_classes(config)
            shared = pool if config.trainer.rollout_shares_devices else None  # e.g. both pools on one GPU
            rollout_cls = create_colocated_worker_cls(rollout_roles)
            rollout_fused, rollout_pool = _ray_group(config, rollout_cls, ROLLOUT, on=shared)
        except BaseException:
            fused_group.kill()
            pool.remove()
            raise
        groups.update(rollout_fused.spawn(prefix_set=[ROLLOUT]))
        logger.info("placement: split, the rollout on its own %d worker(s)", rollout_fused.world_size)
    workers = WorkerGroups(
        actor_rollout=groups[ACTOR_ROLLOUT],
        critic=groups.get(CRITIC),
        reward_model=groups.get(REWARD_MODEL),
        world_size=data_parallel_size(config),
        backend=backend,
        rollout=groups.get(ROLLOUT, groups[ACTOR_ROLLOUT]),
        teacher=groups.get(TEACHER),
        _fused=fused_group,
        _pool=pool,
        _rollout_fused=rollout_fused,
        _rollout_pool=rollout_pool,
        _owns_process_group=owns_process_group,
    )
    try:
        # the actor last: its engine sizes the KV cache
        for role in (ROLLOUT, TEACHER, CRITIC, REWARD_MODEL, ACTOR_ROLLOUT):
            if role in groups:
                groups[role].init_model(timeout=config.trainer.worker_init_timeout_s)
    except BaseException:  # the caller never gets the groups: end the workers here, so nothing is left running
        workers.shutdown()
        raise
    return workers
