"""Optimizer, warmup and schedules, and the guarded step."""

import itertools
import math

import pytest
import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor

from hyflow.config.common import OptimConfig
from hyflow.workers.fsdp import build_device_mesh
from hyflow.workers.optim import (
    build_lr_scheduler,
    build_optimizer,
    clip_grad_norm,
    clip_grad_norm_and_step,
    fused_adamw_step,
    is_plain_fused_adamw,
)

from .distributed import run_ranks


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


def clipped_by_hand(grads: list[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    norm = torch.stack([grad.float().square().sum() for grad in grads]).sum().sqrt()
    return norm, [grad.float() * min(1.0, max_norm / (float(norm) + 1e-6)) for grad in grads]


@pytest.mark.parametrize("max_norm", [0.5, 100.0])  # clipping, and a norm already under the bound
def test_clip_grad_norm_scales_every_gradient_by_the_global_norm_also_for_mixed_dtypes(max_norm):
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(5, 3)), torch.nn.Parameter(torch.zeros(7).bfloat16())]
    for param in params:
        param.grad = torch.randn(param.shape, generator=g).to(param.dtype)
    expected_norm, expected = clipped_by_hand([p.grad for p in params], max_norm)
    norm = clip_grad_norm(params, max_norm)
    torch.testing.assert_close(norm, expected_norm, rtol=1e-3, atol=0)  # bf16 entries: bf16 precision
    for param, want in zip(params, expected):
        torch.testing.assert_close(param.grad.float(), want, rtol=1e-2, atol=1e-3)


def clip_sharded_on_two_ranks(rank: int) -> dict:
    """FSDP2 shards a model over 2 ranks; its gradients, clipped through the shards, gathered back whole."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    fully_shard(model, mesh=build_device_mesh())
    g = torch.Generator().manual_seed(1)
    for param in model.parameters():  # sharded gradients, as FSDP2's backward leaves them
        param.grad = distribute_tensor(torch.randn(param.shape, generator=g), param.device_mesh, param.placements)
    whole = [p.grad.full_tensor().clone() for p in model.parameters()]
    norm = clip_grad_norm(list(model.parameters()), max_norm=0.1)
    return {"grads": whole, "norm": norm, "clipped": [p.grad.full_tensor() for p in model.parameters()]}


@pytest.mark.multiproc
def test_clipping_sharded_gradients_on_two_ranks_equals_clipping_the_whole_gradients():
    results = run_ranks(clip_sharded_on_two_ranks, 2)
    expected_norm, expected = clipped_by_hand(results[0]["grads"], max_norm=0.1)
    assert float(expected_norm) > 0.1  # the bound bites
    for result in results:  # every rank gets the global norm and the same clipped gradients
        torch.testing.assert_close(result["norm"], expected_norm)
        for clipped, want in zip(result["clipped"], expected):
            torch.testing.assert_close(clipped, want)


def adamw_twins(sharded: bool = False) -> list[tuple[torch.nn.Module, torch.optim.AdamW]]:
    """Two copies of one model, each with its own fused AdamW (the CPU has a fused kernel too)."""
    twins = []
    for _ in range(2):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
        if sharded:
            fully_shard(model, mesh=build_device_mesh())
        twins.append((model, torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1, fused=True)))
    return twins


def step_both(twins, seed: int, found_inf: torch.Tensor | None = None) -> None:
    """The same gradients into both (drawn from `seed`, sharded like the parameters); torch's step on the first,
    fused_adamw_step on the second (with `found_inf`, the first does not step)."""
    for index, (model, optimizer) in enumerate(twins):
        g = torch.Generator().manual_seed(seed)
        for param in model.parameters():
            grad = torch.randn(param.shape, generator=g)
            is_sharded = hasattr(param, "device_mesh")
            param.grad = distribute_tensor(grad, param.device_mesh, param.placements) if is_sharded else grad
        if index == 0 and found_inf is None:
            optimizer.step()
        elif index == 1:
            fused_adamw_step(optimizer, found_inf)
        optimizer.zero_grad()


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def assert_same_params_and_state(twins) -> None:
    (model, optimizer), (other, other_optimizer) = twins
    for param, other_param in zip(model.parameters(), other.parameters()):
        assert torch.equal(full(param), full(other_param))
        state, other_state = optimizer.state[param], other_optimizer.state[other_param]
        assert set(state) == set(other_state) == {"step", "exp_avg", "exp_avg_sq"}
        for key in state:
            assert torch.equal(full(state[key]), full(other_state[key])), key


def test_the_fused_step_on_local_tensors_is_torchs_adamw_step_and_found_inf_changes_nothing():
    twins = adamw_twins()
    assert all(is_plain_fused_adamw(optimizer) for _, optimizer in twins)
    for seed in range(3):
        step_both(twins, seed)
        assert_same_params_and_state(twins)
    model, optimizer = twins[1]
    before = [p.detach().clone() for p in model.parameters()]
    step_both(twins, seed=3, found_inf=torch.ones(()))  # a skipped step: neither side moves
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))
    assert_same_params_and_state(twins)
    assert float(optimizer.state[next(model.parameters())]["step"]) == 3.0


def fused_steps_on_two_ranks(rank: int) -> None:
    twins = adamw_twins(sharded=True)
    for seed in range(2):
        step_both(twins, seed)
    assert_same_params_and_state(twins)


@pytest.mark.multiproc
def test_the_fused_step_on_local_shards_equals_torchs_step_on_fsdp2_parameters_over_two_ranks():
    run_ranks(fused_steps_on_two_ranks, 2)


def test_an_optimizer_the_local_step_does_not_cover_is_not_plain():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert not is_plain_fused_adamw(torch.optim.AdamW(params, fused=True, amsgrad=True))
    assert not is_plain_fused_adamw(torch.optim.AdamW(params))  # not fused
    assert not is_plain_fused_adamw(torch.optim.SGD(params, lr=0.1))
