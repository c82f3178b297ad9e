"""Optimizer, warmup and schedules, and the guarded step."""

import itertools
import math

import pytest
import torch

from hyflow.config.common import OptimConfig
from hyflow.workers.optim import build_lr_scheduler, build_optimizer, clip_grad_norm_and_step


def lrs(config: OptimConfig, steps: int) -> list[float]:
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(2))], config)
    scheduler = build_lr_scheduler(optimizer, config)
    values = []
    for _ in range(steps):
        values.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return values


def test_warmup_by_steps_then_constant():
    assert lrs(OptimConfig(lr=1.0, lr_warmup_steps=4), 6) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_warmup_by_ratio_then_cosine_down_to_the_minimum():
    config = OptimConfig(
        lr=1.0, lr_warmup_steps_ratio=0.2, lr_scheduler_type="cosine", total_training_steps=10, min_lr_ratio=0.1
    )
    values = lrs(config, 11)
    assert values[:2] == pytest.approx([0.5, 1.0])
    assert values[2] == pytest.approx(1.0)
    assert values[6] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 8)))
    assert values[10] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(values[2:]))


def test_cosine_without_total_steps_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match="total_training_steps"):
        lrs(OptimConfig(lr_scheduler_type="cosine"), 1)


def test_clipping_bounds_the_gradient_norm_and_a_nan_gradient_skips_the_step():
    layer = torch.nn.Linear(3, 1)
    optimizer = build_optimizer(layer.parameters(), OptimConfig(lr=0.1))
    layer(torch.full((1, 3), 100.0)).sum().backward()
    grad_norm, skipped = clip_grad_norm_and_step(layer, optimizer, grad_clip=1.0)
    assert grad_norm > 1.0 and skipped == 0.0
    before = [p.detach().clone() for p in layer.parameters()]
    layer(torch.full((1, 3), float("nan"))).sum().backward()
    grad_norm, skipped = clip_grad_norm_and_step(layer, optimizer, grad_clip=1.0)
    assert not torch.isfinite(grad_norm) and skipped == 1.0
    assert all(torch.equal(p, q) for p, q in zip(before, layer.parameters()))
