"""The routers of a transformers mixture-of-experts model, and what they chose in a forward.

Shape legend: L = MoE layers, N = tokens the decoder ran (B·T padded, or the packed tokens), E = experts,
k = experts per token.

    capture = RouterCapture(policy)                  # finds model.layers.{i}.mlp.gate (Qwen3-MoE, Qwen2-MoE, Mixtral)
    with capture.recording() as routed:
        log_probs, _ = policy(...)
    routed.logits, routed.indices, routed.layers     # (L, N, E) with autograd, (L, N, k), [i for each MoE layer]

transformers 5's routers (`Qwen3MoeTopKRouter`, `Qwen2MoeTopKRouter`, `MixtralTopKRouter`) return
`(router_logits, routing_weights, expert_indices)`; a forward hook on each keeps the logits and indices of the
forward inside `recording()` (outside it, e.g. when gradient checkpointing recomputes a layer in backward, the hook
does nothing). A hook sees what the router returned, so under routing replay it sees the replayed experts.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

_LAYER = re.compile(r"layers\.(\d+)\.")


def router_modules(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(decoder layer index, router) of every MoE layer of `model`, in layer order: the modules named
    `...layers.{i}.mlp.gate` (or the router a peft LoRA wrapper of that name holds) that carry `top_k`
    (transformers' top-k routers; a dense model has none)."""
    routers = []
    for name, module in model.named_modules():
        match = _LAYER.search(name)
        if not (name.endswith("mlp.gate") and match):
            continue
        while hasattr(module, "base_layer"):  # peft's wrapper of a LoRA-adapted router: the router inside
            module = module.base_layer
        if hasattr(module, "top_k"):
            routers.append((int(match.group(1)), module))
    return sorted(routers, key=lambda pair: pair[0])


@dataclass
class RoutedTokens:
    """What the routers of one forward chose, stacked over the MoE layers in the order they ran."""

    layers: list[int] = field(default_factory=list)
    _logits: list[torch.Tensor] = field(default_factory=list)
    _indices: list[torch.Tensor] = field(default_factory=list)

    @property
    def logits(self) -> torch.Tensor:
        return torch.stack(self._logits)  # (L, N, E)

    @property
    def indices(self) -> torch.Tensor:
        return torch.stack(self._indices)  # (L, N, k)


class RouterCapture:
    """Forward hooks on a model's routers that record their logits and chosen experts inside `recording()`."""

    def __init__(self, model: nn.Module):
        self.routers = router_modules(model)
        self._routed: RoutedTokens | None = None
        for layer, router in self.routers:
            router.register_forward_hook(self._hook(layer))

    @property
    def num_experts(self) -> int:
        router = self.routers[0][1]
        return int(getattr(router, "num_experts", None) or router.weight.shape[0])

    def _hook(self, layer: int):
        def record(module: nn.Module, args, output) -> None:
            if self._routed is None:
                return
            if not (isinstance(output, tuple) and len(output) == 3):
                raise TypeError(
                    f"the router of layer {layer} ({type(module).__name__}) returned {type(output).__name__}, not "
                    "transformers 5's (router_logits, routing_weights, expert_indices); hyflow reads MoE routing "
                    "from transformers >= 5 models"
                )
            self._routed.layers.append(layer)
            self._routed._logits.append(output[0])
            self._routed._indices.append(output[2])

        return record

    @contextlib.contextmanager
    def recording(self) -> Iterator[RoutedTokens]:
        """Record the routers of the forward run inside the block."""
        self._routed = RoutedTokens()
        try:
            yield self._routed
        finally:
            self._routed = None
