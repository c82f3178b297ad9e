"""The mixture-of-experts terms of the actor update: the router's load-balancing loss and the expert-load metrics.

Shape legend: B = rows, T = trimmed micro-batch length, R = response length, L = MoE layers, E = experts.

    balance = RouterBalance(policy, config)           # None-free: `balance.enabled` is False for a dense model
    with balance.recording() as routed:                # around the micro-batch's forward
        log_prob, entropy = policy(...)
    term, metrics = balance.micro_batch_terms(routed, micro, packed, agg_kwargs)   # loss + coef · aux · share
    ...
    load_metrics = balance.update_metrics()            # once per update: moe/layer_{i}/load_max, moe/load_imbalance

Which tokens: the positions whose hidden state predicts a response token with `response_mask` 1, the tokens the
policy loss is taken over. The aux loss of a micro-batch (`load_balancing_loss`, its own routing statistics) is
weighted by its share of the mini-batch's response tokens counted over all ranks (`batch_num_tokens`), times the
dp size as `agg_loss` does, so its size does not depend on how many micro-batches or ranks the mini-batch is cut
into. f·P is not additive over tokens, so this is the token-weighted mean of the micro-batches' balance losses
(Megatron's micro-batch-level balancing), equal to the whole mini-batch's only when it is one micro-batch. The
expert load is a count, so its metrics are exact for the whole update: counts accumulate on the device over every
micro-batch and reach the host once, after one all-reduce.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict

from hyflow import fields as F
from hyflow.algorithms import expert_load, load_balancing_loss
from hyflow.models.moe_routers import RoutedTokens, RouterCapture
from hyflow.models.packing import PackedRows
from hyflow.workers.fsdp import is_distributed, training_device


def response_token_positions(micro: TensorDict, packed: PackedRows | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows of the routers' (N, E) logits, their weights): the positions predicting each response token, with
    its `response_mask`. Padded: position b·T + t, t = T − R − 1 + j for response token j; packed: `sources`."""
    response_mask = micro[F.RESPONSE_MASK]
    if packed is not None and packed.sources is not None:
        return packed.sources, response_mask[packed.response_rows, packed.response_cols].float()
    rows, length = micro[F.INPUT_IDS].shape
    response_length = response_mask.shape[1]
    cols = torch.arange(length - response_length - 1, length - 1, device=response_mask.device)
    positions = torch.arange(rows, device=response_mask.device)[:, None] * length + cols
    return positions.reshape(-1), response_mask.reshape(-1).float()


def router_aux_loss_coef(config: Any, model_config: Any) -> float:
    """`actor.router_aux_loss_coef`, or the model config's `router_aux_loss_coef` when it is None (0 without)."""
    if config.router_aux_loss_coef is not None:
        return float(config.router_aux_loss_coef)
    return float(getattr(model_config, "router_aux_loss_coef", 0.0) or 0.0)


class RouterBalance:
    """The actor's MoE terms for one policy module; `enabled` is False (and every method a no-op) without routers."""

    def __init__(self, module: torch.nn.Module, config: Any):
        self.capture = RouterCapture(module)
        self.enabled = bool(self.capture.routers)
        if not self.enabled and config.router_aux_loss_coef:
            raise ValueError(
                f"actor_rollout_ref.actor.router_aux_loss_coef={config.router_aux_loss_coef}, but the model has no "
                "mixture-of-experts routers (no layers.N.mlp.gate), so there is no load-balancing loss to weigh; "
                "leave it null (the model config's coefficient) for dense models."
            )
        self.coef = router_aux_loss_coef(config, getattr(module, "config", None)) if self.enabled else 0.0
        self.interval = config.moe_load_balance_metrics_interval
        self._load: torch.Tensor | None = None  # (L, E) counts of this update, on the device
        self._layers: list[int] = []
        self._track_load = False

    def start_update(self, update_index: int) -> None:
        """Decide whether this update reports the expert load (`moe_load_balance_metrics_interval`: every N-th)."""
        self._track_load = self.enabled and self.interval > 0 and update_index % self.interval == 0
        self._load = None

    @contextlib.contextmanager
    def recording(self) -> Iterator[RoutedTokens | None]:
        if not self.enabled:
            yield None
            return
        with self.capture.recording() as routed:
            yield routed

    def micro_batch_terms(
        self, routed: RoutedTokens | None, micro: TensorDict, packed: PackedRows | None, agg_kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor | float, dict[str, torch.Tensor]]:
        """(coef · aux · share · dp_size, {"actor/router_aux_loss": aux · share}) for one micro-batch, and its expert
        load added to the update's counts; (0.0, {}) for a dense model."""
        if routed is None or not routed.layers:
            return 0.0, {}
        positions, weights = response_token_positions(micro, packed)
        logits, indices = routed.logits[:, positions], routed.indices[:, positions]
        aux = load_balancing_loss(logits, indices, weights)
        share = weights.sum() / agg_kwargs["batch_num_tokens"].clamp_min(1)
        if self._track_load:
            load = expert_load(indices, weights, logits.shape[-1])
            self._load = load if self._load is None else self._load + load
            self._layers = routed.layers
        metrics = {"actor/router_aux_loss": aux.detach() * share}
        return self.coef * aux * share * agg_kwargs["dp_size"], metrics

    def update_metrics(self) -> dict[str, list[float]]:
        """The expert load of the whole update, summed over ranks (one all-reduce, one host copy): per MoE layer i,
        `moe/layer_{i}/load_max` and `load_min` (share of the layer's top-k assignments taken by its busiest and
        idlest expert; 1/E when balanced), and `moe/load_imbalance` (max/mean load, averaged over layers; 1 when
        balanced, E when one expert takes everything) with `moe/load_imbalance_max` (its worst layer)."""
        if self._load is None:
            return {}
        load = self._load
        if is_distributed():
            load = load.to(training_device() if dist.get_backend() == "nccl" else "cpu")
            dist.all_reduce(load)
        share = (load / load.sum(-1, keepdim=True).clamp_min(1e-12)).cpu()  # host sync: once per update
        imbalance = share.max(-1).values * share.shape[-1]  # max / mean, per layer
        metrics = {"moe/load_imbalance": [imbalance.mean().item()], "moe/load_imbalance_max": [imbalance.max().item()]}
        for row, layer in enumerate(self._layers):
            metrics[f"moe/layer_{layer}/load_max"] = [share[row].max().item()]
            metrics[f"moe/layer_{layer}/load_min"] = [share[row].min().item()]
        self._load = None
        return metrics
