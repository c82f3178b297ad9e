"""`critic.*`: the value model trained alongside the actor (used by `algorithm.adv_estimator=gae`).

Keys and defaults follow verl: `critic.model.path` defaults to the actor's model, the mini-batch size, epochs,
shuffling and loss aggregation default to the actor's. `enable=None` turns the critic on exactly when the
estimator is `gae`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hyflow.config.actor_rollout_ref import LossAggMode, Strategy
from hyflow.config.common import CheckpointConfig, FSDPConfig, ModelConfig, OptimConfig, derived, inherit


@dataclass
class CriticModelConfig(ModelConfig):
    """The critic's model: the actor's architecture with a scalar value head; FSDP settings live here (as verl)."""

    path: str | None = inherit("actor_rollout_ref.model.path")
    tokenizer_path: str | None = inherit("actor_rollout_ref.model.path")
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class CriticConfig:
    """PPO value-function update: clipped value loss over mini-/micro-batches like the actor's."""

    enable: bool | None = None  # None: on for gae, off otherwise
    strategy: Strategy = "fsdp"
    rollout_n: int | None = inherit("actor_rollout_ref.rollout.n")
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: int | None = inherit("actor_rollout_ref.actor.ppo_mini_batch_size")
    ppo_micro_batch_size: int | None = None  # verl's deprecated global size: becomes _per_gpu at load
    ppo_micro_batch_size_per_gpu: int | None = None  # None: the whole per-device mini-batch at once
    forward_micro_batch_size: int | None = None  # verl's deprecated global size: becomes _per_gpu at load
    forward_micro_batch_size_per_gpu: int | None = None  # None: ppo_micro_batch_size_per_gpu
    use_dynamic_bsz: bool | None = inherit("actor_rollout_ref.actor.use_dynamic_bsz")
    ppo_max_token_len_per_gpu: int = 32768
    forward_max_token_len_per_gpu: int | None = derived()  # None: ppo_max_token_len_per_gpu
    ppo_epochs: int | None = inherit("actor_rollout_ref.actor.ppo_epochs")
    shuffle: bool | None = inherit("actor_rollout_ref.actor.shuffle")
    grad_clip: float = 1.0
    cliprange_value: float = 0.5
    loss_agg_mode: LossAggMode | None = inherit("actor_rollout_ref.actor.loss_agg_mode")  # noqa: RUF009 (a field)
    ulysses_sequence_parallel_size: int = 1  # verl's; read as data parallelism at load (sequence_parallel.py)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        if self.forward_max_token_len_per_gpu is None:
            self.forward_max_token_len_per_gpu = self.ppo_max_token_len_per_gpu
