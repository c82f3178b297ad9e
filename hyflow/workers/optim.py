"""Optimizer, learning-rate schedule and the guarded optimizer step used by the actor and the critic.

    optimizer = build_optimizer(model.parameters(), config.optim)                 # AdamW
    scheduler = build_lr_scheduler(optimizer, config.optim)                        # warmup, then constant / cosine
    grad_norm, skipped = clip_grad_norm_and_step(model, optimizer, config.grad_clip)   # skipped: non-finite norm

Schedule (s = step, W = warmup steps, S = total steps, r = min_lr_ratio, c = num_cycles):
    s < W:      lr(s) = lr · (s + 1) / W              (the first step already uses a non-zero lr)
    constant:   lr(s) = lr
    cosine:     lr(s) = lr · (r + (1 − r) · ½ · (1 + cos(2π · c · (s − W) / (S − W))))
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hyflow.workers.fsdp import reshard

SCHEDULER_TYPES = ("constant", "cosine")


def build_optimizer(params: Iterable[torch.nn.Parameter], optim_config: Any) -> torch.optim.AdamW:
    """AdamW over the trainable parameters with `lr`, `betas`, `weight_decay` from the optim config."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ValueError("build_optimizer: the model has no trainable parameters (all have requires_grad=False).")
    betas = tuple(optim_config.betas)
    if len(betas) != 2:
        raise ValueError(f"optim.betas={list(betas)!r} must hold two numbers, e.g. [0.9, 0.999].")
    fused = all(p.device.type == "cuda" for p in trainable)  # one kernel for all parameters on CUDA
    return torch.optim.AdamW(
        trainable, lr=optim_config.lr, betas=betas, weight_decay=optim_config.weight_decay, fused=fused or None
    )


def num_warmup_steps(optim_config: Any, total_steps: int) -> int:
    """`lr_warmup_steps` if set (>= 0), else `lr_warmup_steps_ratio * total_steps`."""
    if optim_config.lr_warmup_steps is not None and optim_config.lr_warmup_steps >= 0:
        return int(optim_config.lr_warmup_steps)
    if optim_config.lr_warmup_steps_ratio > 0 and total_steps <= 0:
        raise ValueError(
            f"optim.lr_warmup_steps_ratio={optim_config.lr_warmup_steps_ratio} needs optim.total_training_steps "
            f"(got {total_steps}); set total_training_steps or use optim.lr_warmup_steps instead."
        )
    return int(optim_config.lr_warmup_steps_ratio * max(total_steps, 0))


def lr_multiplier(
    step: int, warmup_steps: int, total_steps: int, scheduler_type: str, min_lr_ratio: float, num_cycles: float
) -> float:
    """The factor applied to the base lr at `step` (see the module docstring for the formula)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if scheduler_type == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(2.0 * math.pi * num_cycles * progress))


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_config: Any) -> torch.optim.lr_scheduler.LambdaLR:
    """A `LambdaLR` with linear warmup then a constant or cosine schedule (`lr_scheduler_type`)."""
    scheduler_type = optim_config.lr_scheduler_type
    if scheduler_type not in SCHEDULER_TYPES:
        raise ValueError(
            f"optim.lr_scheduler_type={scheduler_type!r} is not supported; use one of {list(SCHEDULER_TYPES)}."
        )
    total_steps = int(optim_config.total_training_steps)
    if scheduler_type == "cosine" and total_steps <= 0:
        raise ValueError(
            f"optim.lr_scheduler_type='cosine' needs optim.total_training_steps > 0 (got {total_steps}); the trainer "
            "fills it in from the data size, or set it yourself."
        )
    warmup = num_warmup_steps(optim_config, total_steps)
    min_lr_ratio, num_cycles = float(optim_config.min_lr_ratio), float(optim_config.num_cycles)

    def multiplier(step: int) -> float:
        return lr_multiplier(step, warmup, total_steps, scheduler_type, min_lr_ratio, num_cycles)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients of `params` in place so that their global L2 norm is at most `max_norm`; returns the
    norm before clipping (fp32, 0-dim).

        ‖g‖ = sqrt(Σ_p ‖g_p‖²),   g ← g · min(1, max_norm / (‖g‖ + 1e-6))   (as torch.nn.utils.clip_grad_norm_)

    FSDP2's gradients are shards (DTensor, Shard placements over one mesh): the norm is computed on the local
    shards with one all-reduce of Σ‖shard‖² over the mesh, not op by op through DTensor's dispatch. Anything
    else (replicated gradients, gradients on several devices) goes through torch's own clip_grad_norm_."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    meshes = {g.device_mesh for g in grads if isinstance(g, DTensor)}
    sharded = all(isinstance(g, DTensor) and all(p.is_shard() for p in g.placements) for g in grads)
    local = [local_tensor(g) for g in grads]
    if (meshes and (not sharded or len(meshes) > 1)) or len({g.device for g in local}) > 1:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
        return (norm.full_tensor() if isinstance(norm, DTensor) else norm).detach().float()
    total = torch.stack([norm.float() for norm in torch._foreach_norm(local)]).square().sum()
    if meshes and (mesh := meshes.pop()).size() > 1:
        dist.all_reduce(total, group=mesh.get_group())  # the shards are disjoint: their squares add up
    total = total.sqrt()
    torch._foreach_mul_(local, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


def clip_grad_norm_and_step(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip the gradient norm to `grad_clip`, then step unless the norm is NaN or inf.

    Returns `(grad_norm, skipped)` as 0-dim float tensors (skipped is 1.0 when the step was skipped), on the
    norm's device. With the fused AdamW on CUDA the decision stays on the device (`fused_adamw_step` with
    `found_inf`), so the host never waits for the backward to finish; elsewhere the norm is read on the host (one
    sync per step). Callers report skipped steps once their metrics reach the host (`warn_about_skipped_steps`).
    """
    reshard(module)  # one rank without FSDP2: the fp32 weights and their gradients back (mixed_precision.py)
    grad_norm = clip_grad_norm(list(module.parameters()), grad_clip)
    if grad_norm.is_cuda and is_plain_fused_adamw(optimizer):
        skipped = (~torch.isfinite(grad_norm)).float()
        fused_adamw_step(optimizer, found_inf=skipped)
    else:
        is_finite = bool(torch.isfinite(grad_norm))  # host sync: skip the step on a non-finite norm
        if is_finite:
            optimizer.step()
        skipped = torch.tensor(0.0 if is_finite else 1.0, device=grad_norm.device)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, skipped


def is_plain_fused_adamw(optimizer: torch.optim.Optimizer) -> bool:
    """An AdamW as `build_optimizer` makes it: fused, float lr, no amsgrad / maximize / capturable."""
    return isinstance(optimizer, torch.optim.AdamW) and all(
        group.get("fused") and not group.get("amsgrad") and not group.get("maximize")
        and not group.get("capturable") and not isinstance(group["lr"], torch.Tensor)
        for group in optimizer.param_groups
    )  # fmt: skip


def fused_adamw_step(optimizer: torch.optim.AdamW, found_inf: torch.Tensor | None = None) -> None:
    """`optimizer.step()` of a plain fused AdamW (`is_plain_fused_adamw`), run on the parameters' local tensors.

    Per group: step += 1, then one fused kernel over every parameter with a gradient,

        m ← β₁m + (1−β₁)g,  v ← β₂v + (1−β₂)g²,  θ ← θ(1 − lr·λ) − lr · (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε)

    with the state torch's AdamW keeps (`step`, `exp_avg`, `exp_avg_sq`, created alike), so state_dict and
    checkpoints are unchanged. With `found_inf` (1.0: the gradient norm was not finite) the kernel changes
    nothing and the step count is taken back. Why not `optimizer.step()`: FSDP2's parameters, gradients and
    moments are DTensors, and DTensor's dispatch of that one call over every parameter costs 8–33 ms of host time
    per step for a 0.5B model, on the critical path of a host-bound update; their local tensors are the data.
    """
    for group in optimizer.param_groups:
        lists: tuple[list[torch.Tensor], ...] = ([], [], [], [], [])  # params, grads, exp_avgs, exp_avg_sqs, steps
        for param in group["params"]:
            if param.grad is None:
                continue
            state = optimizer.state[param]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            tensors = (param, param.grad, state["exp_avg"], state["exp_avg_sq"], state["step"])
            for bucket, tensor in zip(lists, tensors):
                bucket.append(local_tensor(tensor))
        params, grads, exp_avgs, exp_avg_sqs, steps = lists
        if not params:
            continue
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        torch._fused_adamw_(
            params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"], beta1=beta1,
            beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"], maximize=False, grad_scale=None,
            found_inf=found_inf,
        )  # fmt: skip
        if found_inf is not None:
            torch._foreach_sub_(steps, [found_inf] * len(steps))


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The data of a DTensor on this rank (its local shard, no autograd wrapper); any other tensor itself."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor
