"""Padding removal on CUDA: the flash-attention varlen kernel agrees with row-by-row attention, forward and backward."""

import pytest
import torch

from hyflow.models.packing import _rowwise_sdpa, varlen_attention

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_varlen_attention_equals_row_by_row_attention_with_grouped_query_heads(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    lengths = [17, 300, 1, 64, 129]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (
        torch.randn(sum(lengths), heads, 64, generator=g, device="cuda", dtype=dtype).requires_grad_()
        for heads in (14, 2, 2)
    )
    flash = varlen_attention(q, k, v, cu_seqlens, max(lengths))
    grads = torch.autograd.grad(flash.float().square().sum(), (q, k, v))
    reference = _rowwise_sdpa(q.float(), k.float(), v.float(), cu_seqlens, None)
    reference_grads = torch.autograd.grad(reference.square().sum(), (q, k, v))
    torch.testing.assert_close(flash.float(), reference, rtol=2e-2, atol=2e-2)
    for grad, expected in zip(grads, reference_grads):
        scale = expected.abs().max().item()
        torch.testing.assert_close(grad.float(), expected.float(), rtol=5e-2, atol=2e-2 * scale)
