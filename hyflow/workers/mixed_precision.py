"""Mixed precision on one rank without FSDP2: fp32 master weights, compute copies cast once per step.

    precision = SingleRankMixedPrecision(model, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    loss = model(...); loss.backward(); ...            # every forward computes with the bf16 copies
    precision.reshard()                                # fp32 weights and fp32 gradients back, the copies freed

FSDP2 over one rank still runs its all-gather path every step: the pre-forward casts each fp32 parameter and moves
it through a one-rank all-gather into the bf16 parameter (20 ms a step at 0.5B on the H200), and the gradient
reduction copies every gradient into a flat buffer and out again (with the casts, ~1,350 `aten::copy_` a step).
With nothing to shard, this class does only what FSDP2's `MixedPrecisionPolicy` defines, with the same roundings:

    first forward after a reshard (unshard):  w_c = cast(w_fp32, param_dtype)           one foreach copy
    forward inputs:                          floating tensors cast to param_dtype     (cast_forward_inputs)
    each backward, per parameter:            g_acc = cast(g_c, reduce_dtype), then g_acc += g_c
    reshard (after the last backward):       param.data = w_fp32, param.grad = g_acc; the copies are freed

The module keeps its Parameter objects (the optimizer's): only their `.data` is swapped. `apply_fsdp2` uses it at
world size 1 when the policy casts and nothing is offloaded; `fsdp.reshard` (after a no-grad forward) and the guarded
optimizer step (`optim.clip_grad_norm_and_step`, before it reads the gradients) call `reshard`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.distributed.utils import _apply_to_tensors  # FSDP2's own walk over forward inputs (dicts, dataclasses)


class SingleRankMixedPrecision:
    """The bf16 (`param_dtype`) compute copies of a module's parameters and their gradients' accumulation in
    `reduce_dtype`, on one rank (see the module docstring)."""

    def __init__(self, module: nn.Module, param_dtype: torch.dtype, reduce_dtype: torch.dtype = torch.float32):
        self.params = list(module.parameters())  # tied weights once
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.masters: list[torch.Tensor] | None = None  # the fp32 data while the copies are in place
        self.grads: dict[int, torch.Tensor] = {}  # parameter index -> gradient accumulated in reduce_dtype
        self.held: dict[int, torch.Tensor] = {}  # gradients the parameters held at unshard, added at reshard
        module.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
        for index, param in enumerate(self.params):
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(functools.partial(self._accumulate, index))

    @property
    def unsharded(self) -> bool:
        return self.masters is not None

    def unshard(self) -> None:
        """Casts every parameter into a fresh compute copy (one foreach copy) and puts the copies in place; a
        gradient a parameter holds is set aside until `reshard` (FSDP2 adds the new gradient to it there)."""
        if self.masters is not None:
            return
        masters = [param.data for param in self.params]
        copies = [torch.empty_like(master, dtype=self.param_dtype) for master in masters]
        torch._foreach_copy_(copies, masters)
        for index, (param, copy) in enumerate(zip(self.params, copies)):
            if param.grad is not None:
                self.held[index], param.grad = param.grad, None
            param.data = copy
        self.masters = masters

    def reshard(self) -> None:
        """Puts the fp32 weights back (the copies are freed) with their accumulated gradients."""
        if self.masters is None:
            return
        for param, master in zip(self.params, self.masters):
            param.data = master
        self.masters = None
        for index, grad in self.grads.items():
            held = self.held.pop(index, None)
            self.params[index].grad = grad if held is None else held.add_(grad)
        for index, held in self.held.items():  # no gradient since: the one it had
            self.params[index].grad = held
        self.grads, self.held = {}, {}

    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        self.unshard()
        return _apply_to_tensors(self._cast_input, (args, kwargs))

    def _cast_input(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.param_dtype) if torch.is_floating_point(tensor) else tensor

    def _accumulate(self, index: int, param: torch.Tensor) -> None:
        """After autograd accumulated a backward's gradient into the compute copy: add it to the accumulator in
        `reduce_dtype` (FSDP2's order: the first is cast, the next ones added) and clear it."""
        accumulated = self.grads.get(index)
        if accumulated is None:
            self.grads[index] = param.grad.to(self.reduce_dtype)
        else:
            accumulated.add_(param.grad)
        param.grad = None
