"""Padding removal on CUDA: the flash-attention varlen kernel agrees with row-by-row attention, forward and backward;
a forward packed on the host never syncs."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from hyflow.models.packing import _rowwise_sdpa, pack_rows, varlen_attention
from hyflow.models.policy import PolicyModel
from hyflow.models.tiny import build_tiny_model
from tests.models.test_packing import ragged_batch

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


def test_a_packed_forward_with_a_packing_made_on_the_host_never_waits_for_the_device(tmp_path):
    lm = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "tiny"), dtype=torch.bfloat16).cuda()
    policy = PolicyModel(lm, remove_padding=True)
    input_ids, attention_mask, position_ids = ragged_batch(lm.config.vocab_size)
    responses = input_ids[:, -5:]
    packed = pack_rows(attention_mask, response_length=5)  # on the host: no device involved
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host-device sync below raises
    try:
        inputs = [t.pin_memory().cuda(non_blocking=True) for t in (input_ids, attention_mask, position_ids, responses)]
        log_probs, entropy = policy(*inputs, compute_entropy=True, packed=packed.to(torch.device("cuda")))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected, expected_entropy = policy(*inputs, compute_entropy=True)  # packed here, from the device mask
    torch.testing.assert_close(log_probs, expected)
    torch.testing.assert_close(entropy, expected_entropy)
