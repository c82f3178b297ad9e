"""The one-kernel end of a decode-window step (sampler combine, record, advance) equals the PyTorch path of
multi_step.decode_step on the same logits and state.

Runs where `engine_testkit.needs_triton` lets it: CUDA, or the CPU under Triton's interpreter."""

from __future__ import annotations

import copy

import pytest
import torch

from hyflow.engine.decode_state import DecodeState
from hyflow.engine.multi_step import decode_step
from hyflow.engine.sampler import SamplingTensors, gumbel_noise

from .engine_testkit import TRITON_DEVICE, needs_triton

pytestmark = needs_triton
ON_CUDA = TRITON_DEVICE == "cuda"
BLOCK_SIZE, SCRATCH_SLOT = 4, 63 * 4
TABLES = [
    [1, 2, 10, 11, 12, 13],
    [4, 3, 0, 0, 0, 0],
    [6, 7, 8, 0, 0, 0],
    [20, 21, 22, 23, 24, 25],
    [30, 31, 32, 33, 34, 35],
]


def window_state(need_raw: bool, device: str) -> DecodeState:
    """Five rows mid-window (step 2 of 4): greedy and sampled rows, one row out of budget, one at a block edge."""
    rows = 5
    sampling = SamplingTensors(
        temperatures=torch.tensor([0.0, 1.0, 0.7, 1.3, 0.0]),
        top_k=torch.full((rows,), -1),
        top_p=torch.ones(rows),
        seeds=torch.tensor([11, 12, 13, 14, 15]),
        counters=torch.tensor([3, 9, 0, 4, 7]),
        need_filter=False,
        need_raw=need_raw,
    )
    state = DecodeState(
        input_ids=torch.tensor([5, 6, 7, 8, 9]),
        positions=torch.tensor([10, 3, 7, 22, 15]),
        slot_mapping=torch.tensor([42, 17, 31, 58, SCRATCH_SLOT]),
        block_tables=torch.tensor(TABLES),
        steps_left=torch.tensor([2, 1, 3, 1, 0]),
        sampling=sampling,
        step=torch.tensor([2]),
        tokens=torch.zeros(rows, 4, dtype=torch.long),
        log_probs=torch.zeros(rows, 4),
        raw_log_probs=torch.zeros(rows, 4) if need_raw else None,
        rows=torch.arange(rows),
    )
    return move(state, device)


def move(state: DecodeState, device: str) -> DecodeState:
    moved = copy.deepcopy(state)
    for name, value in vars(moved).items():
        if isinstance(value, torch.Tensor):
            setattr(moved, name, value.to(device))
    for name, value in vars(moved.sampling).items():
        if isinstance(value, torch.Tensor):
            setattr(moved.sampling, name, value.to(device))
    return moved


def reference_partials(logits: torch.Tensor, st: SamplingTensors, split_size: int):
    """The sampler kernel's per-split outputs, from the PyTorch sampler's own noise (for the interpreter run, where
    the sampler kernel's loop does not run; on CUDA the kernel itself is used and is tested in test_gpu.py)."""
    from hyflow.engine.triton_kernels import SamplePartials

    greedy = (st.temperatures == 0).unsqueeze(1)
    scaled = logits / torch.where(greedy, 1.0, st.temperatures.unsqueeze(1))
    keys = torch.where(greedy, logits, scaled + gumbel_noise(st.seeds, st.counters, logits.shape[1]))
    columns = [values.split(split_size, dim=1) for values in (keys, scaled, logits)]
    best = [part.max(dim=1) for part in columns[0]]
    maxes = [part.max(dim=1).values for part in columns[1]]
    raw_maxes = [part.max(dim=1).values for part in columns[2]]
    return SamplePartials(
        keys=torch.stack([b.values for b in best], 1),
        tokens=torch.stack([b.indices + i * split_size for i, b in enumerate(best)], 1),
        maxes=torch.stack(maxes, 1),
        sums=torch.stack([(p - m.unsqueeze(1)).exp().sum(1) for p, m in zip(columns[1], maxes)], 1),
        raw_maxes=torch.stack(raw_maxes, 1),
        raw_sums=torch.stack([(p - m.unsqueeze(1)).exp().sum(1) for p, m in zip(columns[2], raw_maxes)], 1),
    )


@pytest.mark.parametrize("need_raw", [False, True], ids=["log-probs", "with-raw"])
def test_the_fused_step_end_equals_the_pytorch_sample_record_and_advance(need_raw):
    from hyflow.engine import triton_kernels, triton_step

    torch.manual_seed(0)
    logits = torch.randn(5, 40_000) * 3  # three vocabulary splits
    expected = window_state(need_raw, "cpu")
    decode_step(lambda *_: logits, expected, None, BLOCK_SIZE, SCRATCH_SLOT)  # the PyTorch path on the CPU

    device = "cuda" if ON_CUDA else "cpu"
    got = window_state(need_raw, device)
    st = got.sampling
    device_logits = logits.to(device)
    if ON_CUDA:
        partials = triton_kernels.sample_partials(device_logits, st.temperatures, st.seeds, st.counters)
    else:
        partials = reference_partials(device_logits, st, triton_kernels.SPLIT_SIZE)
    triton_step.finish_step(device_logits, partials, st.temperatures, got, BLOCK_SIZE, SCRATCH_SLOT)

    for name in ("tokens", "input_ids", "positions", "slot_mapping", "steps_left", "step"):
        assert torch.equal(getattr(got, name).cpu(), getattr(expected, name)), name
    assert torch.equal(got.sampling.counters.cpu(), expected.sampling.counters)
    torch.testing.assert_close(got.log_probs.cpu(), expected.log_probs, atol=1e-5, rtol=1e-5)
    if need_raw:
        torch.testing.assert_close(got.raw_log_probs.cpu(), expected.raw_log_probs, atol=1e-5, rtol=1e-5)
    assert got.tokens[:, 2].cpu().tolist() == got.input_ids.cpu().tolist()  # the step's column, fed back
