"""The torch reference of the fused RMSNorm and SiLU-and-mul (their CPU path) equals Hugging Face's modules."""

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from hyflow.models.kernels import rms_norm, silu_mul
from hyflow.models.kernels.functions import rotary
from hyflow.models.kernels.patch import ORIGINAL_ROTARY


def value_and_grads(fn, inputs, grad_output):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    output = fn(*inputs)
    return (output, *torch.autograd.grad(output, inputs, grad_output))


@pytest.mark.parametrize("norm_class", [Qwen2RMSNorm, LlamaRMSNorm])
@pytest.mark.parametrize("shape", [(2, 5, 24), (3, 4, 2, 8)])  # (B, T, H) and Qwen3's per-head (B, T, heads, d)
def test_rms_norm_equals_the_hf_module_in_fp32_forward_and_backward(norm_class, shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g) * 3
    module = norm_class(shape[-1], eps=1e-5)
    with torch.no_grad():
        module.weight.copy_(torch.rand(shape[-1], generator=g) + 0.5)
    grad_output = torch.randn(shape, generator=g)

    def hf(x, weight):
        return torch.func.functional_call(module, {"weight": weight}, (x,))

    got = value_and_grads(lambda x, w: rms_norm(x, w, 1e-5), [x, module.weight], grad_output)
    want = value_and_grads(hf, [x, module.weight], grad_output)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=2e-6)


def test_silu_mul_equals_the_hf_mlp_activation_in_fp32_forward_and_backward():
    g = torch.Generator().manual_seed(1)
    gate, up = torch.randn(4, 7, 33, generator=g) * 4, torch.randn(4, 7, 33, generator=g)
    grad_output = torch.randn(4, 7, 33, generator=g)
    got = value_and_grads(silu_mul, [gate, up], grad_output)
    want = value_and_grads(lambda a, b: nn.SiLU()(a) * b, [gate, up], grad_output)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=2e-6)


def test_rotary_equals_the_hf_apply_rotary_pos_emb_in_fp32_forward_and_backward():
    hf_rotary = modeling_qwen2.apply_rotary_pos_emb
    hf_rotary = getattr(hf_rotary, ORIGINAL_ROTARY, hf_rotary)  # the original, even once another test patched it
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 5, 4, 8, generator=g).transpose(1, 2)  # (B, H, T, D) as a view of (B, T, H, D), like HF's
    k = torch.randn(2, 5, 2, 8, generator=g).transpose(1, 2)
    angles = torch.rand(1, 5, 4, generator=g) * 6
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    grad_q, grad_k = torch.randn(q.shape, generator=g), torch.randn(k.shape, generator=g)

    def rotated_and_grads(fn):
        q_, k_ = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
        out_q, out_k = fn(q_, k_)
        return [out_q, out_k, *torch.autograd.grad((out_q, out_k), (q_, k_), (grad_q, grad_k))]

    got = rotated_and_grads(lambda q, k: (rotary(q, cos, sin), rotary(k, cos, sin)))
    want = rotated_and_grads(lambda q, k: hf_rotary(q, k, cos, sin))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=2e-6)


def test_fused_ops_compute_in_fp32_and_return_the_input_dtype():
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(6, 40, generator=g) * 2).bfloat16()
    weight = (torch.rand(40, generator=g) + 0.5).bfloat16()
    y = rms_norm(x, weight, 1e-6)
    x32 = x.float()
    exact = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, exact.bfloat16())  # one rounding, at the end
    gate, up = x, x.flip(0)
    out = silu_mul(gate, up)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (nn.functional.silu(gate.float()) * up.float()).bfloat16())


def test_silu_mul_rejects_gate_and_up_of_different_shapes():
    with pytest.raises(ValueError, match="one shape and dtype"):
        silu_mul(torch.zeros(2, 3), torch.zeros(2, 4))
