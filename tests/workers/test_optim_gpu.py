"""The guarded optimizer step on CUDA: the fused AdamW decides on the device whether to step (no host sync)."""

import pytest
import torch
from torch.distributed.fsdp import fully_shard

from hyflow.config.common import OptimConfig
from hyflow.workers.fsdp import build_device_mesh
from hyflow.workers.optim import build_optimizer, clip_grad_norm_and_step

from .distributed import run_ranks

LR, WEIGHT_DECAY = 0.1, 0.01
pytestmark = [pytest.mark.gpu, pytest.mark.multiproc]


def guarded_steps_on_one_gpu(rank: int) -> dict:
    """A finite step, then a NaN one, each with every host-device sync an error; what changed after each."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)).cuda()
    fully_shard(model, mesh=build_device_mesh())  # DTensor parameters, as the workers train them
    optimizer = build_optimizer(model.parameters(), OptimConfig(lr=LR, weight_decay=WEIGHT_DECAY))
    start = [p.full_tensor().clone() for p in model.parameters()]
    results = {"fused": bool(optimizer.defaults.get("fused")), "start": [p.cpu() for p in start]}
    for name, value in (("finite", 1.0), ("nan", float("nan"))):
        model(torch.full((4, 8), value, device="cuda")).sum().backward()
        grads = [p.grad.full_tensor().clone() for p in model.parameters()]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            grad_norm, skipped = clip_grad_norm_and_step(model, optimizer, grad_clip=1e9)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        state = optimizer.state[next(iter(model.parameters()))]
        results[name] = {
            "grad_norm": grad_norm.item(),
            "skipped": skipped.item(),
            "grads": [g.cpu() for g in grads],
            "params": [p.full_tensor().cpu() for p in model.parameters()],
            "step": float(state["step"]),
        }
    return results


def test_the_fused_step_decides_on_the_device_and_a_nan_norm_leaves_everything_as_it_was():
    [result] = run_ranks(guarded_steps_on_one_gpu, 1, backend="nccl", timeout_s=300)
    assert result["fused"]
    finite, nan = result["finite"], result["nan"]
    assert finite["skipped"] == 0.0 and finite["step"] == 1.0
    for start, grad, param in zip(result["start"], finite["grads"], finite["params"]):
        # Adam's first step moves each weight by lr · g / (|g| + eps), after decoupled weight decay.
        expected = start * (1 - LR * WEIGHT_DECAY) - LR * grad / (grad.abs() + 1e-8)
        torch.testing.assert_close(param, expected, rtol=1e-5, atol=1e-5)
    assert nan["skipped"] == 1.0 and nan["grad_norm"] != nan["grad_norm"]  # NaN
    assert nan["step"] == 1.0  # the step count is not advanced
    for before, after in zip(finite["params"], nan["params"]):
        assert torch.equal(before, after)
