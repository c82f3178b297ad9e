"""`DataParallelPPOActor`: log-probs of responses and the PPO policy update, data-parallel under FSDP2.

Shape legend: B = rows on this rank, R = response length, T = prompt + response length.

    actor = DataParallelPPOActor(config.actor_rollout_ref.actor, policy, optimizer, mini_batch_size=64)
    log_probs, entropys = actor.compute_log_prob(data)      # (B, R) each; data.meta_info: temperature, ...
    metrics = actor.update_policy(data)                      # {"actor/pg_loss": [per mini-batch], ...}

The update, per mini-batch (one optimizer step):

    loss = pg_loss − entropy_coeff · entropy + kl_loss_coef · kl_loss

each term aggregated with `agg_loss(loss_agg_mode)` over the *global* mini-batch: the token count (token-mean) or
sequence count (seq-mean-*) is summed over this rank's micro-batches and all-reduced over ranks before the first
forward, so the gradient does not depend on how the mini-batch was cut into micro-batches or ranks. Metrics are
accumulated as tensors and reach the host once, at the end.

Each micro-batch is cut on the host to the columns that hold tokens (`trim_padding`) and copied to the device
through pinned memory; fixed-size micro-batches take rows longest first, so they cut well.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict

from hyflow import fields as F
from hyflow.algorithms import agg_loss, get_policy_loss_fn, kl_penalty
from hyflow.protocol import DataProto
from hyflow.workers.batching import (
    pad_responses,
    restore_order,
    split_micro_batches,
    split_mini_batches,
    to_device,
    trim_padding,
)
from hyflow.workers.fsdp import is_distributed, reshard, training_device
from hyflow.workers.optim import clip_grad_norm_and_step

logger = logging.getLogger(__name__)

MODEL_INPUTS = (F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS, F.RESPONSES)


def global_counts(response_mask: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(tokens, sequences with at least one token, dp size) of the mini-batch summed over all ranks."""
    counts = to_device(torch.stack([response_mask.sum(), (response_mask.sum(-1) > 0).sum()]).float(), device)
    dp_size = 1
    if is_distributed():
        dist.all_reduce(counts)  # one collective per mini-batch; no host sync
        dp_size = dist.get_world_size()
    return counts[0], counts[1], dp_size


def reduce_metrics_across_ranks(step_metrics: list[dict[str, torch.Tensor]]) -> dict[str, list[float]]:
    """Sum each metric's per-rank contributions over ranks (one all-reduce) and bring them to the host once."""
    if not step_metrics:
        return {}
    names = sorted(step_metrics[0])
    # host sync: once per update, after the last optimizer step
    stacked = torch.stack([torch.stack([m[name].detach().float().cpu() for name in names]) for m in step_metrics])
    summed = torch.tensor([not name.endswith(("grad_norm", "lr", "num_skipped_steps")) for name in names])
    if is_distributed():
        reduced = (stacked * summed).to(training_device() if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(reduced)
        stacked = torch.where(summed, reduced.cpu(), stacked)
    values = stacked.tolist()
    return {name: [row[i] for row in values] for i, name in enumerate(names)}


class DataParallelPPOActor:
    """Computes log-probs and runs PPO updates for one data-parallel rank of a (possibly FSDP2) `PolicyModel`."""

    def __init__(
        self,
        config: Any,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        mini_batch_size: int | None = None,
    ):
        """`config` is the actor config (`ActorConfig`); `mini_batch_size` is in rows on this rank (the worker
        turns `ppo_mini_batch_size` prompts into rows: × rollout.n ÷ world size); None means all rows."""
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.mini_batch_size = mini_batch_size
        self.device = training_device()
        self.policy_loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
        self._num_updates = 0

    def _forward(self, micro: TensorDict, temperature: float, compute_entropy: bool):
        """Log-probs (and entropies) of a micro-batch that is already on the training device."""
        return self.module(
            micro[F.INPUT_IDS],
            micro[F.ATTENTION_MASK],
            micro[F.POSITION_IDS],
            micro[F.RESPONSES],
            temperature=temperature,
            compute_entropy=compute_entropy,
        )

    @torch.no_grad()
    def compute_log_prob(
        self, data: DataProto, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, R) of `responses` (and entropies when asked), in the input's row order.

        `data.meta_info`: `temperature` (the rollout's; logits are divided by it), `micro_batch_size`,
        `use_dynamic_bsz`, `max_token_len` (the token budget when dynamic).
        """
        meta = data.meta_info
        batch = data.batch.select(*MODEL_INPUTS)
        max_token_len = meta.get(F.MAX_TOKEN_LEN) if meta.get(F.USE_DYNAMIC_BSZ, False) else None
        micro_batches, bins = split_micro_batches(batch, meta.get(F.MICRO_BATCH_SIZE), max_token_len)
        was_training = self.module.training
        self.module.eval()
        log_probs, entropys = [], []
        response_length = batch[F.RESPONSES].shape[1]
        for micro in micro_batches:
            micro = to_device(trim_padding(micro), self.device)
            lp, ent = self._forward(micro, meta.get(F.TEMPERATURE, 1.0), calculate_entropy)
            log_probs.append(pad_responses(lp, response_length))
            entropys.append(pad_responses(ent, response_length) if calculate_entropy else None)
        reshard(self.module)
        self.module.train(was_training)
        # Padding positions are 0 whatever the micro-batch they were trimmed with.
        is_token = batch[F.ATTENTION_MASK][:, -response_length:].float()
        log_probs = restore_order(log_probs, bins).cpu() * is_token
        return log_probs, (restore_order(entropys, bins).cpu() * is_token if calculate_entropy else None)

    def _micro_batch_loss(
        self, micro: TensorDict, temperature: float, agg_kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's share of the mini-batch loss, and its metric contributions (summing to the mean)."""
        config = self.config
        compute_entropy = config.entropy_coeff != 0
        micro = to_device(trim_padding(micro), self.device)
        log_prob, entropy = self._forward(micro, temperature, compute_entropy)
        mask = micro[F.RESPONSE_MASK].to(log_prob.dtype)
        extra = {F.ROLLOUT_LOG_PROBS: micro[F.ROLLOUT_LOG_PROBS]} if F.ROLLOUT_LOG_PROBS in micro else {}
        pg_loss, pg_metrics = self.policy_loss_fn(
            micro[F.OLD_LOG_PROBS],
            log_prob,
            micro[F.ADVANTAGES],
            mask,
            config.loss_agg_mode,
            config,
            **agg_kwargs,
            **extra,
        )
        dp_size = agg_kwargs["dp_size"]
        token_share = mask.sum() / agg_kwargs["global_num_tokens"].clamp_min(1)  # this micro-batch's token weight
        metrics = {f"actor/{k}": v.detach() * token_share for k, v in pg_metrics.items()}
        metrics["actor/pg_loss"] = pg_loss.detach() / dp_size
        loss = pg_loss
        if compute_entropy:
            entropy_loss = agg_loss(entropy, mask, config.loss_agg_mode, **agg_kwargs)
            loss = loss - config.entropy_coeff * entropy_loss
            metrics["actor/entropy"] = entropy_loss.detach() / dp_size
        if config.use_kl_loss:
            kld = kl_penalty(log_prob, micro[F.REF_LOG_PROB], config.kl_loss_type)
            kl_loss = agg_loss(kld, mask, config.loss_agg_mode, **agg_kwargs)
            loss = loss + config.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach() / dp_size
        return loss, metrics

    def _update_keys(self, data: DataProto) -> list[str]:
        keys = [*MODEL_INPUTS, F.RESPONSE_MASK, F.OLD_LOG_PROBS, F.ADVANTAGES]
        if self.config.use_kl_loss:
            keys.append(F.REF_LOG_PROB)
        if F.ROLLOUT_LOG_PROBS in data.batch:
            keys.append(F.ROLLOUT_LOG_PROBS)
        return keys

    def _mini_batch_step(self, mini: TensorDict, temperature: float) -> dict[str, torch.Tensor]:
        """Accumulate gradients over the micro-batches of one mini-batch, then clip and step."""
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
            loss, micro_metrics = self._micro_batch_loss(micro, temperature, agg_kwargs)
            loss.backward()
            for name, value in micro_metrics.items():
                metrics[name] = metrics[name] + value
        grad_norm, skipped = clip_grad_norm_and_step(self.module, self.optimizer, config.grad_clip)
        metrics["actor/grad_norm"] = grad_norm
        metrics["actor/num_skipped_steps"] = skipped
        metrics["actor/lr"] = torch.tensor(self.optimizer.param_groups[0]["lr"])
        return dict(metrics)

    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """`ppo_epochs` passes over the data in mini-batches; returns metrics with one value per optimizer step."""
        if self.optimizer is None:
            raise ValueError("DataParallelPPOActor.update_policy needs an optimizer (this actor was built without).")
        temperature = data.meta_info.get(F.TEMPERATURE, 1.0)
        batch = data.batch.select(*self._update_keys(data))
        mini_batch_size = self.mini_batch_size or batch.batch_size[0]
        generator = torch.Generator().manual_seed(self._num_updates)
        self.module.train()
        step_metrics = []
        for _ in range(self.config.ppo_epochs):
            for mini in split_mini_batches(batch, mini_batch_size, self.config.shuffle, generator):
                step_metrics.append(self._mini_batch_step(mini, temperature))
        self._num_updates += 1
        return reduce_metrics_across_ranks(step_metrics)
