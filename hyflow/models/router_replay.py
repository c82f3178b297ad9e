"""Routing replay: a training forward of a mixture-of-experts model that uses given experts instead of choosing them.

The engine and the trainer compute the same router logits only up to rounding (other kernels, bf16), and a top-k
flips on near-ties: the trainer then scores a token with experts the engine never used, which is train–inference
mismatch of a kind no importance ratio repairs (the two policies are different networks for that token). Routing
replay makes the trainer use the experts that were chosen before (verl's `actor.router_replay.mode`):

- R3 ("rollout routing replay", Ma et al. 2025): the experts the engine chose while generating (its routing record,
  `routed_experts`), in every training forward of the batch: old log-probs, reference, update.
- R2: the experts the trainer itself chose in the batch's old-log-prob pass, replayed in the update, so the update's
  ratio compares the same network before and after the step.

A replayed router keeps its own probabilities at the replayed experts, so the router still learns:

    p = softmax(x W_rᵀ)  (fp32)          e = the replayed ids (k,)          w_j = p[e_j] (/ Σ_i p[e_i] when the family
    renormalises: Mixtral, Qwen-MoE with norm_topk_prob), rounded as the family rounds them

and y = Σ_j w_j · expert_{e_j}(x). The gradient reaches W_r through the weights w of the replayed experts (and any
auxiliary loss through the logits); what it loses is the top-k choice itself, which has no gradient anyway. A token
without a record (padding; the last token of a sequence, never fed to the engine; `has_record` false) is routed by
the trainer as usual.

It works on transformers' own MoE blocks: a forward hook on each router (`mlp.gate`: Qwen3MoeTopKRouter,
Qwen2MoeTopKRouter, MixtralTopKRouter, whose forward returns (logits, weights, ids)) replaces its output. The state
set for a forward stays until the next one, so activation checkpointing's recomputation in backward replays the
same experts. Shapes: N tokens of the forward (flattened as the model flattens them), Lm MoE layers, k, X experts.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
from torch import nn

from hyflow.engine.routing_cache import no_record_value
from hyflow.models.moe_routers import router_modules


def find_routers(model: nn.Module) -> list[nn.Module]:
    """transformers' MoE routers of `model`, in layer order (`moe_routers.router_modules` finds them)."""
    return [router for _, router in router_modules(model)]


def replay_routing(
    router_logits: torch.Tensor,
    replayed: torch.Tensor,
    own_ids: torch.Tensor,
    normalize: bool,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (N, k), expert ids (N, k)) of a router told to use `replayed` (N, k): w = softmax(logits)[ids], / Σ
    when `normalize`, in `out_dtype`; rows of `replayed` without a record (`no_record_value`) keep `own_ids`."""
    recorded = (replayed != no_record_value(replayed.dtype)).all(-1, keepdim=True)
    ids = torch.where(recorded, replayed.long(), own_ids)
    weights = torch.softmax(router_logits, dim=-1, dtype=torch.float32).gather(-1, ids)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(out_dtype), ids


class RouterReplay:
    """Hooks on a model's routers. `replay(ids)`: the next forwards use `ids` (N, Lm, k); `record()`: they keep
    the experts they chose (`recorded()` (N, Lm, k) after a forward); `off()`: the routers run as they are."""

    def __init__(self, model: nn.Module) -> None:
        self.routers = find_routers(model)
        self.mode: Literal["off", "replay", "record"] = "off"
        self.ids: torch.Tensor | None = None
        self.records: dict[int, torch.Tensor] = {}
        for index, router in enumerate(self.routers):
            # first among the router's hooks, whenever it is made: the others (moe_routers.RouterCapture: the
            # load-balancing loss and the expert-load metrics) then see the replayed experts
            router.register_forward_hook(functools.partial(self._hook, index), prepend=True)

    def replay(self, ids: torch.Tensor) -> None:
        if ids.shape[1] != len(self.routers):
            raise ValueError(
                f"routed_experts holds {ids.shape[1]} MoE layers per token, the model has {len(self.routers)} "
                "routers: the routing was recorded by a different model; record it with the model being trained"
            )
        self.mode, self.ids = "replay", ids

    def record(self) -> None:
        self.mode, self.ids, self.records = "record", None, {}

    def off(self) -> None:
        self.mode, self.ids = "off", None

    def recorded(self, dtype: torch.dtype) -> torch.Tensor:
        """The experts (N, Lm, k) the routers chose in the last forward, as `dtype`."""
        return torch.stack([self.records[i] for i in range(len(self.routers))], dim=1).to(dtype)

    def _hook(self, index: int, router: nn.Module, _inputs: tuple, output: tuple) -> tuple | None:
        if self.mode == "record":
            self.records[index] = output[2].detach()  # recomputation in backward overwrites the same entry
            return None
        if self.mode == "off":
            return None
        if not (isinstance(output, tuple) and len(output) == 3):
            raise TypeError(
                f"routing replay expects {type(router).__name__}.forward to return (router_logits, weights, expert "
                "ids), as transformers 5's MoE routers do; this transformers version's router does not. Fix: set "
                "actor_rollout_ref.actor.router_replay.mode=disabled, or use transformers >= 5"
            )
        logits, weights, own_ids = output
        replayed = self.ids[:, index].to(logits.device)
        if replayed.shape[0] != logits.shape[0]:
            raise ValueError(
                f"routed_experts gives {replayed.shape[0]} tokens to a router that sees {logits.shape[0]}: the "
                "replayed routing and the batch's tokens are out of step"
            )
        normalize = getattr(router, "norm_topk_prob", True)  # Mixtral always renormalises
        new_weights, ids = replay_routing(logits, replayed, own_ids, normalize, weights.dtype)
        return logits, new_weights, ids
