"""`DataParallelPPOCritic`: value estimates and the clipped value-loss update, data-parallel under FSDP2.

Shape legend: B = rows on this rank, R = response length, T = prompt + response length.

    critic = DataParallelPPOCritic(config.critic, value_model, optimizer, mini_batch_size=64)
    values = critic.compute_values(data)           # (B, R): V at each response position
    metrics = critic.update_critic(data)           # {"critic/vf_loss": [per mini-batch], ...}

The value of response token t is read from the hidden state at the position *before* it (the state the policy
acted from), matching the log-prob alignment. The loss is `compute_value_loss` aggregated over the global
mini-batch token count, so the update does not depend on the micro-batch size or the number of ranks.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from tensordict import TensorDict

from hyflow import fields as F
from hyflow.algorithms import compute_value_loss, masked_mean
from hyflow.protocol import DataProto
from hyflow.workers.actor import global_counts, reduce_metrics_across_ranks
from hyflow.workers.batching import (
    pad_responses,
    restore_order,
    split_micro_batches,
    split_mini_batches,
    to_device,
    trim_padding,
)
from hyflow.workers.fsdp import reshard, training_device
from hyflow.workers.optim import clip_grad_norm_and_step

MODEL_INPUTS = (F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS, F.RESPONSES)


class DataParallelPPOCritic:
    """Computes values and runs value-function updates for one data-parallel rank of a `ValueModel`."""

    def __init__(
        self,
        config: Any,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        mini_batch_size: int | None = None,
    ):
        """`config` is the critic config (`CriticConfig`); `mini_batch_size` is in rows on this rank."""
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.mini_batch_size = mini_batch_size
        self.device = training_device()
        self._num_updates = 0

    def _forward(self, micro: TensorDict) -> torch.Tensor:
        """Values at the response positions of a micro-batch that is already on the training device."""
        response_length = micro[F.RESPONSES].shape[-1]
        values = self.module(micro[F.INPUT_IDS], micro[F.ATTENTION_MASK], micro[F.POSITION_IDS])
        return values[:, -response_length - 1 : -1]

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values (B, R) in the input's row order, zero outside `response_mask`. Reads the same meta_info keys as
        the actor's `compute_log_prob` (`micro_batch_size`, `use_dynamic_bsz`, `max_token_len`)."""
        meta = data.meta_info
        batch = data.batch.select(*MODEL_INPUTS, F.RESPONSE_MASK)
        max_token_len = meta.get(F.MAX_TOKEN_LEN) if meta.get(F.USE_DYNAMIC_BSZ, False) else None
        micro_batches, bins = split_micro_batches(batch, meta.get(F.MICRO_BATCH_SIZE), max_token_len)
        was_training = self.module.training
        self.module.eval()
        response_length = batch[F.RESPONSES].shape[1]
        values = [
            pad_responses(self._forward(to_device(trim_padding(micro), self.device)), response_length)
            for micro in micro_batches
        ]
        reshard(self.module)
        self.module.train(was_training)
        return restore_order(values, bins).cpu() * batch[F.RESPONSE_MASK]

    def _mini_batch_step(self, mini: TensorDict) -> dict[str, torch.Tensor]:
        config = self.config
        max_token_len = config.ppo_max_token_len_per_gpu if config.use_dynamic_bsz else None
        micro_batches, _ = split_micro_batches(mini, config.ppo_micro_batch_size_per_gpu, max_token_len)
        num_tokens, num_seqs, dp_size = global_counts(mini[F.RESPONSE_MASK], self.device)
        agg_kwargs = {
            "global_num_tokens": num_tokens,
            "global_batch_size": num_seqs,
            "loss_scale_factor": mini[F.RESPONSES].shape[-1],
            "dp_size": dp_size,
        }
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=self.device))
        for micro in micro_batches:
            micro = to_device(trim_padding(micro), self.device)
            vpreds = self._forward(micro)
            mask = micro[F.RESPONSE_MASK].to(vpreds.dtype)
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds, micro[F.RETURNS], micro[F.VALUES], mask, config.cliprange_value, config.loss_agg_mode,
                **agg_kwargs,
            )  # fmt: skip
            vf_loss.backward()
            token_share = mask.sum() / num_tokens.clamp_min(1)
            metrics["critic/vf_loss"] = metrics["critic/vf_loss"] + vf_loss.detach() / dp_size
            metrics["critic/vf_clipfrac"] = metrics["critic/vf_clipfrac"] + vf_clipfrac * token_share
            vpred_mean = masked_mean(vpreds.detach(), mask)
            metrics["critic/vpred_mean"] = metrics["critic/vpred_mean"] + vpred_mean * token_share
        grad_norm, skipped = clip_grad_norm_and_step(self.module, self.optimizer, config.grad_clip)
        metrics["critic/grad_norm"] = grad_norm
        metrics["critic/num_skipped_steps"] = skipped
        metrics["critic/lr"] = torch.tensor(self.optimizer.param_groups[0]["lr"])
        return dict(metrics)

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """`ppo_epochs` passes in mini-batches over `values` (old), `returns`; one metric value per step."""
        if self.optimizer is None:
            raise ValueError("DataParallelPPOCritic.update_critic needs an optimizer (this critic was built without).")
        batch = data.batch.select(*MODEL_INPUTS, F.RESPONSE_MASK, F.VALUES, F.RETURNS)
        mini_batch_size = self.mini_batch_size or batch.batch_size[0]
        generator = torch.Generator().manual_seed(self._num_updates)
        self.module.train()
        step_metrics = []
        for _ in range(self.config.ppo_epochs):
            for mini in split_mini_batches(batch, mini_batch_size, self.config.shuffle, generator):
                step_metrics.append(self._mini_batch_step(mini))
        self._num_updates += 1
        return reduce_metrics_across_ranks(step_metrics)
