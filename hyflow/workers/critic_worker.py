"""`CriticWorker`: the value model (FSDP2) as a worker: `init_model`, `compute_values`, `update_critic`, checkpoints.

    n = config.actor_rollout_ref.rollout.n
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(CriticWorker, config.critic, rollout_n=n))
    wg.init_model()
    values = wg.compute_values(batch)                          # DataProto with `values` (B, R)
    metrics = wg.update_critic(batch).meta_info["metrics"]

The model is the actor's architecture with a scalar value head (`hyflow.models.value_head.ValueModel`), loaded from
`critic.model.path`; `ppo_mini_batch_size` counts prompts, × `rollout_n` rows, split over the ranks (as the actor).
"""

from __future__ import annotations

import logging
from typing import Any

from hyflow import fields as F
from hyflow.config import CriticConfig
from hyflow.controller import Dispatch, Worker, register
from hyflow.protocol import DataProto
from hyflow.workers import builders
from hyflow.workers.checkpoint import ShardCheckpointer
from hyflow.workers.critic import DataParallelPPOCritic
from hyflow.workers.fsdp import build_device_mesh, move_optimizer_state, training_device
from hyflow.workers.micro_batch_loop import ForwardSettings

logger = logging.getLogger(__name__)


class CriticWorker(Worker):
    """One data-parallel rank of the critic."""

    def __init__(self, config: CriticConfig, rollout_n: int | None = None):
        """`config` is the finalized `critic` section (`hyflow.config.load_config`: every inherited and per-device
        value filled in); `rollout_n` defaults to `config.rollout_n`."""
        self.config = config
        self.rollout_n = rollout_n if rollout_n is not None else (config.rollout_n or 1)
        self.critic: DataParallelPPOCritic | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_distributed()
        config = self.config
        model_config = config.model
        builders.import_external_lib(model_config)
        path = builders.model_path(model_config, "critic.model")
        self.tokenizer = builders.tokenizer_for(model_config, path, "critic.model")
        fsdp_config = model_config.fsdp_config
        module = builders.build_value_model(model_config, fsdp_config, build_device_mesh(), path)
        optimizer, self.lr_scheduler = builders.build_optimizer_and_scheduler(module, config.optim)
        mini_batch_size = builders.rows_per_rank(
            config.ppo_mini_batch_size, self.rollout_n, self.world_size, "critic.ppo_mini_batch_size"
        )
        self.critic = DataParallelPPOCritic(config, module, optimizer, mini_batch_size)
        self.checkpointer = ShardCheckpointer(
            module, optimizer, self.lr_scheduler, config.checkpoint.save_contents, config.checkpoint.load_contents
        )
        self._hf_config = module.config
        if fsdp_config.optimizer_offload:
            move_optimizer_state(optimizer, "cpu")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """`values` (B, R): the critic's estimate at each response position."""
        config = self.config
        settings = ForwardSettings(
            micro_batch_size=config.forward_micro_batch_size_per_gpu,
            max_token_len=config.forward_max_token_len_per_gpu if config.use_dynamic_bsz else None,
        )
        return DataProto.from_dict({F.VALUES: self.critic.compute_values(data, settings)}, meta_info={})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """One value-function update over the batch, then one LR-scheduler step."""
        offload = self.config.model.fsdp_config.optimizer_offload
        if offload:
            move_optimizer_state(self.critic.optimizer, training_device())
        metrics = self.critic.update_critic(data)
        self.lr_scheduler.step()
        if offload:
            move_optimizer_state(self.critic.optimizer, "cpu")
        return DataProto(meta_info={F.METRICS: metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0) -> None:
        info = {"kind": "critic", "global_step": global_step, "lora": None}
        self.checkpointer.save(
            local_path, info=info, hf_assets=builders.hf_assets_saver(self._hf_config, self.tokenizer)
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> dict[str, Any]:
        return self.checkpointer.load(local_path)
