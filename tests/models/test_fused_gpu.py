"""The Triton kernels equal their torch references in bf16, forward and backward.

On a CUDA machine: `python -m pytest tests/models/test_fused_gpu.py` (Qwen2-0.5B-like sizes). Without a GPU the
tests are skipped, except under Triton's CPU interpreter, which runs the same kernels on small shapes:
`TRITON_INTERPRET=1 python -m pytest tests/models/test_fused_gpu.py` (needs `pip install triton`; not for CI).
"""

import copy
import os

import pytest
import torch

from hyflow.models.kernels import apply_fused_kernels, rms_norm, silu_mul, use_triton
from hyflow.models.kernels.functions import (
    rms_norm_backward_reference,
    rms_norm_reference,
    rotary,
    rotary_reference,
    silu_mul_backward_reference,
    silu_mul_reference,
)
from hyflow.models.policy import log_probs_from_hidden

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
pytestmark = [pytest.mark.timeout(600)] + ([] if INTERPRETED else [pytest.mark.gpu])
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BIG = DEVICE == "cuda"  # real sizes on the GPU, tiny ones in the interpreter


@pytest.fixture(autouse=True)
def needs_triton():
    if not use_triton(torch.empty(0, device=DEVICE)):
        pytest.skip("Triton is not installed")


def randn(*shape, scale=1.0, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randn(shape, generator=g, device=DEVICE) * scale).to(dtype)


def assert_close_bf16(got, want, rel=2e-2):
    """Within a couple of bf16 roundings, measured against the tensor's scale."""
    got, want = got.float(), want.float()
    assert got.shape == want.shape
    scale = want.abs().max().clamp_min(1e-6)
    assert (got - want).abs().max() <= rel * scale, f"max error {(got - want).abs().max():.3g} at scale {scale:.3g}"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("compute_entropy", [False, True])
def test_lm_head_kernels_equal_the_torch_reference_in_bf16(temperature, compute_entropy):
    num_positions, hidden_size, vocab_size = (1500, 896, 151936) if BIG else (37, 16, 301)
    hidden = randn(num_positions, hidden_size, seed=1)
    weight = randn(vocab_size, hidden_size, scale=0.05 if BIG else 0.5, seed=2)
    labels = torch.randint(0, vocab_size, (num_positions,), device=DEVICE)
    grad_log_probs, grad_entropy = randn(num_positions, dtype=torch.float32, seed=3), randn(num_positions, seed=4)
    results = []
    for fused in (True, False):
        inputs = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
        chunk_size = None if fused else 512
        log_probs, entropy = log_probs_from_hidden(
            *inputs, labels, temperature, compute_entropy, chunk_size, use_fused_kernels=fused
        )
        loss = (log_probs * grad_log_probs).sum() + (entropy * grad_entropy.float()).sum()
        results.append((log_probs, entropy, *torch.autograd.grad(loss, inputs)))
    (log_probs, entropy, grad_hidden, grad_weight), want = results[0], results[1]
    # Both read the same bf16 logits and reduce in fp32: the statistics agree to fp32 rounding.
    torch.testing.assert_close(log_probs, want[0], atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(entropy, want[1], atol=1e-3, rtol=1e-4)
    assert_close_bf16(grad_hidden, want[2])
    assert_close_bf16(grad_weight, want[3])


@pytest.mark.parametrize("shape", [(4096, 896), (2048, 14, 64)] if BIG else [(33, 40), (5, 3, 16)])
def test_rms_norm_kernels_equal_the_torch_reference_in_bf16(shape):
    x, weight, grad_output = randn(*shape, scale=3, seed=1), randn(shape[-1], seed=2), randn(*shape, seed=3)
    x_, weight_ = x.clone().requires_grad_(), weight.clone().requires_grad_()
    y = rms_norm(x_, weight_, 1e-6)
    grad_x, grad_weight = torch.autograd.grad(y, [x_, weight_], grad_output)

    rows = x.reshape(-1, shape[-1])
    want_y, rstd = rms_norm_reference(rows, weight, 1e-6)
    want_grad_x, want_grad_weight = rms_norm_backward_reference(grad_output.reshape(rows.shape), rows, weight, rstd)
    assert_close_bf16(y, want_y.reshape(shape), rel=1e-2)
    assert_close_bf16(grad_x, want_grad_x.reshape(shape), rel=1e-2)
    assert_close_bf16(grad_weight, want_grad_weight, rel=1e-2)


def test_silu_mul_kernels_equal_the_torch_reference_in_bf16():
    shape = (8192, 4864) if BIG else (7, 300)
    gate, up, grad_output = randn(*shape, scale=3, seed=1), randn(*shape, seed=2), randn(*shape, seed=3)
    gate_, up_ = gate.clone().requires_grad_(), up.clone().requires_grad_()
    out = silu_mul(gate_, up_)
    grad_gate, grad_up = torch.autograd.grad(out, [gate_, up_], grad_output)
    want_grad_gate, want_grad_up = silu_mul_backward_reference(grad_output, gate, up)
    assert_close_bf16(out, silu_mul_reference(gate, up), rel=1e-2)
    assert_close_bf16(grad_gate, want_grad_gate, rel=1e-2)
    assert_close_bf16(grad_up, want_grad_up, rel=1e-2)


@pytest.mark.parametrize("num_heads", [14, 2])  # Qwen2-0.5B's query and key heads
def test_rotary_kernels_equal_the_torch_reference_in_bf16(num_heads):
    batch, seq_len, head_dim = (8, 1280, 64) if BIG else (2, 5, 8)
    x = randn(batch, seq_len, num_heads, head_dim, seed=1).transpose(1, 2)  # (B, H, T, D) view, as HF passes it
    angles = torch.rand(1, seq_len, head_dim // 2, device=DEVICE) * 100
    cos, sin = (torch.cat((angles, angles), -1).cos().bfloat16(), torch.cat((angles, angles), -1).sin().bfloat16())
    grad_output = randn(batch, num_heads, seq_len, head_dim, seed=2)
    x_ = x.clone().requires_grad_()
    out = rotary(x_, cos, sin)
    (grad_x,) = torch.autograd.grad(out, x_, grad_output)
    assert out.stride() == x.stride()  # laid out like the input, as HF's elementwise ops leave it
    assert_close_bf16(out, rotary_reference(x, cos, sin), rel=1e-2)
    assert_close_bf16(grad_x, rotary_reference(grad_output, cos, sin, backward=True), rel=1e-2)


def test_a_patched_bf16_model_trains_like_the_original():
    from tests.models.kernels.test_patch import tiny_causal_lm

    model = tiny_causal_lm("qwen3").to(DEVICE, torch.bfloat16)
    fused = copy.deepcopy(model)
    assert apply_fused_kernels(fused) > 0
    input_ids = torch.randint(0, 97, (2, 9), device=DEVICE)
    grads = []
    for lm in (model, fused):
        logits = lm(input_ids=input_ids).logits.float()
        loss = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, input_ids[:, 1:, None]).mean()
        grads.append(torch.autograd.grad(loss, list(lm.parameters())))
    for want, got in zip(*grads, strict=True):
        assert_close_bf16(got, want, rel=5e-2)
