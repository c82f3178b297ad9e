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

from typing import Any

import torch
from tensordict import TensorDict

from hyflow import fields as F
from hyflow.algorithms import compute_value_loss, masked_mean
from hyflow.models.packing import PackedRows
from hyflow.protocol import DataProto
from hyflow.workers.batching import multi_modal_rows, pad_responses, restore_order, select_model_inputs
from hyflow.workers.fsdp import training_device
from hyflow.workers.micro_batch_loop import ForwardSettings, forward_without_grad, run_ppo_epochs

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

    def _forward(self, micro: TensorDict, packed: PackedRows | None) -> torch.Tensor:
        """Values at the response positions of a micro-batch that is already on the training device (`packed`: its
        packing, made on the host, when the critic removes padding)."""
        response_length = micro[F.RESPONSES].shape[-1]
        inputs = (micro[F.INPUT_IDS], micro[F.ATTENTION_MASK], micro[F.POSITION_IDS])
        values = self.module(*inputs, packed=packed, multi_modal_inputs=multi_modal_rows(micro))
        return values[:, -response_length - 1 : -1]

    def compute_values(self, data: DataProto, settings: ForwardSettings | None = None) -> torch.Tensor:
        """Values (B, R) in the input's row order, zero outside `response_mask`, in micro-batches as `settings`
        says (None: one micro-batch)."""
        batch = select_model_inputs(data, (*MODEL_INPUTS, F.RESPONSE_MASK))
        settings = settings or ForwardSettings()
        outputs, bins = forward_without_grad(self.module, batch, settings, self.device, self._forward)
        response_length = batch[F.RESPONSES].shape[1]
        values = [pad_responses(micro_values, response_length) for micro_values in outputs]
        return restore_order(values, bins).cpu() * batch[F.RESPONSE_MASK]

    def _micro_batch_loss(
        self, micro: TensorDict, packed: PackedRows | None, agg_kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's share of the clipped value loss, and its metric contributions (summing to the mean)."""
        vpreds = self._forward(micro, packed)
        mask = micro[F.RESPONSE_MASK].to(vpreds.dtype)
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds, micro[F.RETURNS], micro[F.VALUES], mask, self.config.cliprange_value, self.config.loss_agg_mode,
            **agg_kwargs,
        )  # fmt: skip
        token_share = mask.sum() / agg_kwargs["batch_num_tokens"].clamp_min(1)  # this micro-batch's token weight
        metrics = {
            "critic/vf_loss": vf_loss.detach() / agg_kwargs["dp_size"],
            "critic/vf_clipfrac": vf_clipfrac * token_share,
            "critic/vpred_mean": masked_mean(vpreds.detach(), mask) * token_share,
        }
        return vf_loss, metrics

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """`ppo_epochs` passes in mini-batches over `values` (old), `returns`; one metric value per step."""
        if self.optimizer is None:
            raise ValueError("DataParallelPPOCritic.update_critic needs an optimizer (this critic was built without).")
        batch = select_model_inputs(data, (*MODEL_INPUTS, F.RESPONSE_MASK, F.VALUES, F.RETURNS))
        self.module.train()
        metrics = run_ppo_epochs(
            self.module,
            self.optimizer,
            batch,
            self.config,
            mini_batch_size=self.mini_batch_size or batch.batch_size[0],
            seed=self._num_updates,
            device=self.device,
            metric_prefix="critic",
            micro_batch_loss=self._micro_batch_loss,
        )
        self._num_updates += 1
        return metrics
