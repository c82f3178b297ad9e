"""`trainer.*`: the run itself: backend, devices, logging, validation and checkpoint cadence, resuming.

verl's defaults, except `n_gpus_per_node=1`, `device="auto"` (CUDA when present, else CPU), `backend="auto"`
(`local` for a one-process run, else `ray`) and `logger=["console"]`, so that a run without overrides works on a
laptop. `trainer.logger=console` (a string, as
verl's quickstart writes it) is read as `["console"]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hyflow.config.common import derived

LoggerName = Literal["console", "wandb", "tensorboard", "mlflow", "swanlab", "file"]


@dataclass
class RayInitConfig:
    """Arguments to `ray.init` (verl's top-level `ray_init`, also accepted under that name)."""

    num_cpus: int | None = None  # None: all of the machine
    address: str | None = None  # None: start a local cluster, or join the one in RAY_ADDRESS


@dataclass
class TrainerConfig:
    """Loop length, cadence of validation and checkpoints, the cluster shape, experiment tracking."""

    # auto: local when the run has one process (nnodes * n_gpus_per_node == 1), else ray (`pip install hyflow[ray]`)
    backend: Literal["auto", "ray", "local"] = "auto"
    device: Literal["auto", "cuda", "cpu"] = "auto"
    nnodes: int = 1
    n_gpus_per_node: int = 1  # processes per node (devices, or CPU processes with device=cpu)
    total_epochs: int = 30
    total_training_steps: int | None = None  # None: total_epochs * batches per epoch
    project_name: str = "hyflow"
    experiment_name: str = "default"
    logger: list[LoggerName] = field(default_factory=lambda: ["console"])
    log_val_generations: int = 0  # how many validation samples to log as text
    rollout_data_dir: str | None = None  # dump each step's generations as JSONL here
    validation_data_dir: str | None = None
    val_before_train: bool = True
    val_only: bool = False
    test_freq: int = -1  # validate every N steps; -1: never during training
    # checkpoint every N steps and after the last one; -1 (the default, as verl): never, so the run leaves nothing
    # to resume or merge (unlike `hyflow sft`, where -1 saves at the end)
    save_freq: int = -1
    critic_warmup: int = 0  # steps that train only the critic
    balance_batch: bool = True  # reorder the batch so every rank (at generation: engine) gets a similar token count
    default_local_dir: str | None = derived()  # None: checkpoints/{project_name}/{experiment_name}
    resume_mode: Literal["auto", "disable", "resume_path"] = "auto"
    resume_from_path: str | None = None
    del_local_ckpt_after_load: bool = False
    max_actor_ckpt_to_keep: int | None = None  # None: keep all
    max_critic_ckpt_to_keep: int | None = None
    seed: int = 1
    # Ray backend: seconds a worker-group call may take before the run stops with an error naming the ranks that did
    # not answer, their nodes and the method (None: no limit; the local backend runs calls in-process, without one)
    worker_call_timeout_s: float | None = 1800.0
    worker_init_timeout_s: float | None = 3600.0  # the same for starting the workers and loading their models
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    # where generation runs: colocated (every role shares the nnodes × n_gpus_per_node pool; generate and update
    # take turns) or split (a rollout pool of rollout_nnodes × rollout_n_gpus_per_node beside it; Ray backend)
    placement: Literal["colocated", "split"] = "colocated"
    rollout_nnodes: int = 1  # split placement: nodes of the rollout pool
    rollout_n_gpus_per_node: int = 1  # split placement: rollout processes per node (devices, or CPU processes)
    # split placement: the rollout processes run on the training pool's devices, one beside each training process
    # (e.g. both pools on one GPU), instead of devices of their own; the rollout pool then has the training size
    rollout_shares_devices: bool = False

    def __post_init__(self) -> None:
        if self.default_local_dir is None:
            self.default_local_dir = f"checkpoints/{self.project_name}/{self.experiment_name}"
