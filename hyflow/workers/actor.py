"""`DataParallelPPOActor`: log-probs of responses and the PPO policy update, data-parallel under FSDP2.

Shape legend: B = rows on this rank, R = response length, T = prompt + response length.

    actor = DataParallelPPOActor(config.actor_rollout_ref.actor, policy, optimizer, mini_batch_size=64)
    log_probs, entropys = actor.compute_log_prob(data, ForwardSettings(micro_batch_size=8, temperature=0.7))
    metrics = actor.update_policy(data, temperature=0.7)     # {"actor/pg_loss": [per mini-batch], ...}

The update, per mini-batch (one optimizer step):

    loss = pg_loss − entropy_coeff · entropy + kl_loss_coef · kl_loss (+ router_aux_loss_coef · router_aux_loss)
           (+ distillation_loss_coef · distillation_loss)

the distillation term in on-policy distillation's direct form (the batch's `meta_info["distillation_loss"]`, the
per-token KL to the teacher's `teacher_log_probs`: `hyflow.algorithms.distillation`); the router term for
mixture-of-experts models (`moe_balance.py`, which also reports the expert load); each term aggregated
with `agg_loss(loss_agg_mode)` over the *global* mini-batch: the token count (token-mean) or sequence count
(seq-mean-*) is summed over this rank's micro-batches and all-reduced over ranks before the first forward, so the
gradient does not depend on how the mini-batch was cut into micro-batches or ranks. Metrics are accumulated as
tensors and reach the host once, at the end.

A batch without `old_log_probs` is trained exactly on-policy: the trainer skips their pass when each batch gets one
optimizer step (`actor_rollout_ref.actor.recompute_old_log_prob`), so the weights of the update's forward are those
that generated the batch; the loss uses old_log_prob = log_prob.detach() (ratio 1, the same gradient) and the
update reports the entropy that the skipped pass would have.

Off-policy corrections (`algorithm.rollout_correction`) reach the loss as keywords: the batch's
`rollout_is_weights` (decoupled mode; every built-in loss multiplies its per-token loss by them) and the
meta_info's `rollout_correction` settings (bypass mode, for the `reinforce_is` loss).

Each micro-batch is cut on the host to the columns that hold tokens (`trim_padding`) and copied to the device
through pinned memory; fixed-size micro-batches take rows longest first, so they cut well.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from tensordict import TensorDict

from hyflow import fields as F
from hyflow.algorithms import agg_loss, get_policy_loss_fn, kl_penalty
from hyflow.algorithms.distillation import distillation_loss_per_token
from hyflow.config.distillation import DistillationLossConfig
from hyflow.engine.routing_cache import no_record_value
from hyflow.models.packing import PackedRows
from hyflow.protocol import DataProto
from hyflow.workers.batching import multi_modal_rows, pad_responses, restore_order, select_model_inputs
from hyflow.workers.fsdp import training_device
from hyflow.workers.micro_batch_loop import ForwardSettings, forward_without_grad, run_ppo_epochs
from hyflow.workers.moe_balance import RouterBalance

logger = logging.getLogger(__name__)

MODEL_INPUTS = (F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS, F.RESPONSES)


def _with_routing(data: DataProto, keys: tuple[str, ...]) -> tuple[str, ...]:
    """`keys` and `routed_experts` when the batch has them (routing replay)."""
    return (*keys, F.ROUTED_EXPERTS) if F.ROUTED_EXPERTS in data.batch.keys() else keys  # noqa: SIM118


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
        self.router_balance = RouterBalance(module, config)  # MoE models: load-balancing loss and expert load
        self._num_updates = 0

    def _forward(
        self,
        micro: TensorDict,
        packed: PackedRows | None,
        temperature: float,
        compute_entropy: bool,
        record_routing: bool = False,
    ):
        """Log-probs (and entropies) of a micro-batch that is already on the training device (`packed`: its
        packing, made on the host, when the policy removes padding). A MoE model replays the micro-batch's
        `routed_experts` when it has them (routing replay, models/router_replay.py), or records its own routing."""
        routed = micro[F.ROUTED_EXPERTS] if F.ROUTED_EXPERTS in micro.keys() else None  # noqa: SIM118
        return self.module(
            micro[F.INPUT_IDS],
            micro[F.ATTENTION_MASK],
            micro[F.POSITION_IDS],
            micro[F.RESPONSES],
            temperature=temperature,
            compute_entropy=compute_entropy,
            packed=packed,
            multi_modal_inputs=multi_modal_rows(micro),
            routed_experts=routed,
            record_routing=record_routing,
        )

    def _forward_recording(
        self, micro: TensorDict, packed: PackedRows | None, temperature: float, width: int, response_length: int
    ):
        """`_forward` with entropies and the experts it chose, (B, width, Lm, k): the micro-batch's trimmed columns
        put back at their place among the batch's `width` (no record in the columns trimmed off)."""
        log_probs, entropys = self._forward(micro, packed, temperature, True, record_routing=True)
        routing = self.module.routing_record
        # trim_padding kept the batch's columns start .. prompt_length + r (r: the micro-batch's response columns)
        start = width - response_length + micro[F.RESPONSES].shape[1] - routing.shape[1]
        marker = no_record_value(routing.dtype)
        full = routing.new_full((routing.shape[0], width, *routing.shape[2:]), marker)
        full[:, start : start + routing.shape[1]] = routing
        return log_probs, entropys, full

    def compute_log_prob_and_routing(
        self, data: DataProto, settings: ForwardSettings | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs and entropies (B, R) as `compute_log_prob` gives them, and the experts the model chose for
        every token, `routed_experts` (B, T, Lm, k) (no record at padding): the old-log-prob pass of routing replay
        R2, whose update replays them."""
        settings = settings or ForwardSettings()
        batch = select_model_inputs(data, MODEL_INPUTS)
        width, response_length = batch[F.INPUT_IDS].shape[1], batch[F.RESPONSES].shape[1]
        forward = functools.partial(
            self._forward_recording, temperature=settings.temperature, width=width, response_length=response_length
        )
        outputs, bins = forward_without_grad(self.module, batch, settings, self.device, forward)
        is_token = batch[F.ATTENTION_MASK][:, -response_length:].float()
        log_probs, entropys = (
            restore_order([pad_responses(out[i], response_length) for out in outputs], bins).cpu() * is_token
            for i in (0, 1)
        )
        return log_probs, entropys, restore_order([out[2] for out in outputs], bins).cpu()

    def compute_log_prob(
        self, data: DataProto, settings: ForwardSettings | None = None, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, R) of `responses` (and entropies when asked), in the input's row order, in micro-batches
        as `settings` says, logits divided by `settings.temperature` (the rollout's). None: one micro-batch, 1.0."""
        settings = settings or ForwardSettings()
        batch = select_model_inputs(data, _with_routing(data, MODEL_INPUTS))
        forward = functools.partial(self._forward, temperature=settings.temperature, compute_entropy=calculate_entropy)
        outputs, bins = forward_without_grad(self.module, batch, settings, self.device, forward)
        response_length = batch[F.RESPONSES].shape[1]
        # Padding positions are 0 whatever the micro-batch they were trimmed with.
        is_token = batch[F.ATTENTION_MASK][:, -response_length:].float()
        log_probs = restore_order([pad_responses(lp, response_length) for lp, _ in outputs], bins).cpu() * is_token
        if not calculate_entropy:
            return log_probs, None
        entropys = restore_order([pad_responses(ent, response_length) for _, ent in outputs], bins).cpu() * is_token
        return log_probs, entropys

    def _micro_batch_loss(
        self,
        micro: TensorDict,
        packed: PackedRows | None,
        agg_kwargs: dict[str, Any],
        temperature: float,
        loss_kwargs: dict[str, Any],
        distillation: DistillationLossConfig | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's share of the mini-batch loss, and its metric contributions (summing to the mean).

        Without `old_log_probs` in the batch (the trainer skipped their pass: one optimizer step per batch, see
        `update_policy`), the old policy is the current one: old_log_prob = log_prob.detach(), ratio 1, and the
        entropy metric, which that pass would have reported, comes from this forward (as in rollout correction's
        bypass mode, whose old log-probs are the engine's)."""
        config = self.config
        on_policy = F.OLD_LOG_PROBS not in micro.keys()  # noqa: SIM118 (TensorDict membership)
        skipped_pass = on_policy or F.ROLLOUT_CORRECTION in loss_kwargs  # bypass mode skips the pass too
        compute_entropy = config.entropy_coeff != 0 or skipped_pass
        with self.router_balance.recording() as routed:
            log_prob, entropy = self._forward(micro, packed, temperature, compute_entropy)
        mask = micro[F.RESPONSE_MASK].to(log_prob.dtype)
        wanted = (F.ROLLOUT_LOG_PROBS, F.ROLLOUT_IS_WEIGHTS, *config.policy_loss.extra_batch_keys)
        extra = {key: micro[key] for key in wanted if key in micro}
        pg_loss, pg_metrics = self.policy_loss_fn(
            log_prob.detach() if on_policy else micro[F.OLD_LOG_PROBS],
            log_prob,
            micro[F.ADVANTAGES],
            mask,
            config.loss_agg_mode,
            config,
            **agg_kwargs,
            **extra,
            **loss_kwargs,
        )
        dp_size = agg_kwargs["dp_size"]
        token_share = mask.sum() / agg_kwargs["batch_num_tokens"].clamp_min(1)  # this micro-batch's token weight
        metrics = {f"actor/{k}": v.detach() * token_share for k, v in pg_metrics.items()}
        metrics["actor/pg_loss"] = pg_loss.detach() / dp_size
        loss = pg_loss
        if config.entropy_coeff != 0:
            entropy_loss = agg_loss(entropy, mask, config.loss_agg_mode, **agg_kwargs)
            loss = loss - config.entropy_coeff * entropy_loss
            metrics["actor/entropy"] = entropy_loss.detach() / dp_size
        elif compute_entropy:  # for the metric only
            metrics["actor/entropy"] = agg_loss(entropy.detach(), mask, config.loss_agg_mode, **agg_kwargs) / dp_size
        if config.use_kl_loss:
            kld = kl_penalty(log_prob, micro[F.REF_LOG_PROB], config.kl_loss_type)
            kl_loss = agg_loss(kld, mask, config.loss_agg_mode, **agg_kwargs)
            loss = loss + config.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach() / dp_size
        if distillation is not None:  # on-policy distillation's direct form
            distill_loss = self._distillation_loss(log_prob, micro[F.TEACHER_LOG_PROBS], mask, agg_kwargs, distillation)
            loss = loss + distillation.distillation_loss_coef * distill_loss
            metrics["actor/distillation_loss"] = distill_loss.detach() / dp_size
        router_loss, router_metrics = self.router_balance.micro_batch_terms(routed, micro, packed, agg_kwargs)
        return loss + router_loss, {**metrics, **router_metrics}

    def _distillation_loss(
        self,
        log_prob: torch.Tensor,
        teacher_log_probs: torch.Tensor,
        mask: torch.Tensor,
        agg_kwargs: dict[str, Any],
        distillation: DistillationLossConfig,
    ) -> torch.Tensor:
        """The direct form's KL term to the teacher (`hyflow.algorithms.distillation`), aggregated as the others."""
        per_token = distillation_loss_per_token(
            log_prob,
            teacher_log_probs,
            distillation.loss_mode,
            distillation.log_prob_min_clamp,
            distillation.loss_max_clamp,
        )
        return agg_loss(per_token, mask, self.config.loss_agg_mode, **agg_kwargs)

    def _update_keys(self, data: DataProto) -> list[str]:
        keys = [*MODEL_INPUTS, F.RESPONSE_MASK, F.ADVANTAGES]
        if F.OLD_LOG_PROBS in data.batch.keys():  # noqa: SIM118 (TensorDict membership)
            keys.append(F.OLD_LOG_PROBS)
        else:
            self._check_one_optimizer_step(data.batch.batch_size[0])
        if self.config.use_kl_loss:
            keys.append(F.REF_LOG_PROB)
        if F.DISTILLATION_LOSS in data.meta_info:
            keys.append(F.TEACHER_LOG_PROBS)
        if F.ROLLOUT_LOG_PROBS in data.batch:
            keys.append(F.ROLLOUT_LOG_PROBS)
        if F.ROLLOUT_IS_WEIGHTS in data.batch:
            keys.append(F.ROLLOUT_IS_WEIGHTS)
        if F.ROUTED_EXPERTS in data.batch:  # routing replay (R3: the engine's, R2: the old-log-prob pass's)
            keys.append(F.ROUTED_EXPERTS)
        for key in self.config.policy_loss.extra_batch_keys:
            if key not in data.batch.keys():  # noqa: SIM118 (TensorDict membership)
                raise ValueError(
                    f"actor_rollout_ref.actor.policy_loss.extra_batch_keys names {key!r}, which the update batch "
                    f"does not carry (it has {sorted(data.batch.keys())}); name a tensor field the trainer fills, "
                    "e.g. token_level_rewards, token_level_scores, values or returns."
                )
            keys.append(key)
        return keys

    def _check_one_optimizer_step(self, num_rows: int) -> None:
        """A batch without `old_log_probs` is trained on-policy, which is exact only for one optimizer step."""
        mini_batch_size = self.mini_batch_size or num_rows
        if self.config.ppo_epochs == 1 and num_rows <= mini_batch_size:
            return
        raise ValueError(
            f"the actor update got no {F.OLD_LOG_PROBS!r} (the trainer skips their pass only for one optimizer step "
            f"per batch), but it would take {self.config.ppo_epochs} epoch(s) over {num_rows} rows in mini-batches "
            f"of {mini_batch_size}, and every step after the first needs the log-probs from before the first. "
            "Fix: compute old_log_probs first (actor_rollout_ref.actor.recompute_old_log_prob=True or auto), or "
            "set ppo_epochs=1 and ppo_mini_batch_size=data.train_batch_size."
        )

    def update_policy(self, data: DataProto, temperature: float = 1.0) -> dict[str, list[float]]:
        """`ppo_epochs` passes over the data in mini-batches; returns metrics with one value per optimizer step.
        `temperature` divides the logits, as it did for the old log-probs (the rollout's).

        `data` without `old_log_probs` means it was generated by the current weights and gets exactly one
        optimizer step: the loss then takes the old log-probs from its own forward (`_micro_batch_loss`)."""
        if self.optimizer is None:
            raise ValueError("DataParallelPPOActor.update_policy needs an optimizer (this actor was built without).")
        # rollout correction's bypass-mode settings, for the reinforce_is loss
        loss_kwargs = {key: data.meta_info[key] for key in (F.ROLLOUT_CORRECTION,) if key in data.meta_info}
        batch = select_model_inputs(data, self._update_keys(data))
        self.module.train()
        self.router_balance.start_update(self._num_updates)
        metrics = run_ppo_epochs(
            self.module,
            self.optimizer,
            batch,
            self.config,
            mini_batch_size=self.mini_batch_size or batch.batch_size[0],
            seed=self._num_updates,
            device=self.device,
            metric_prefix="actor",
            micro_batch_loss=functools.partial(
                self._micro_batch_loss,
                temperature=temperature,
                loss_kwargs=loss_kwargs,
                distillation=data.meta_info.get(F.DISTILLATION_LOSS),
            ),
        )
        self._num_updates += 1
        return {**metrics, **self.router_balance.update_metrics()}
