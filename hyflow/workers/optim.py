"""Optimizer, learning-rate schedule and the guarded optimizer step used by the actor and the critic.

    optimizer = build_optimizer(model.parameters(), config.optim)                 # AdamW
    scheduler = build_lr_scheduler(optimizer, config.optim)                        # warmup, then constant / cosine
    grad_norm, stepped = clip_grad_norm_and_step(model, optimizer, config.grad_clip)

Schedule (s = step, W = warmup steps, S = total steps, r = min_lr_ratio, c = num_cycles):
    s < W:      lr(s) = lr · (s + 1) / W              (the first step already uses a non-zero lr)
    constant:   lr(s) = lr
    cosine:     lr(s) = lr · (r + (1 − r) · ½ · (1 + cos(2π · c · (s − W) / (S − W))))
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor

logger = logging.getLogger(__name__)

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


def clip_grad_norm_and_step(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip the gradient norm to `grad_clip`, then step unless the norm is NaN or inf.

    Returns `(grad_norm, skipped)` as tensors (skipped is 1.0 when the step was skipped). Deciding whether to step
    needs the norm on the host: this is the one deliberate sync per optimizer step.
    """
    params = [p for p in module.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=grad_clip) if params else torch.zeros(())
    if isinstance(grad_norm, DTensor):
        grad_norm = grad_norm.full_tensor()
    is_finite = bool(torch.isfinite(grad_norm))  # host sync: skip the step on a non-finite norm
    if is_finite:
        optimizer.step()
    else:
        logger.warning("gradient norm is %s: skipping this optimizer step", grad_norm.item())
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach().float().cpu(), torch.tensor(0.0 if is_finite else 1.0)  # both on the host
