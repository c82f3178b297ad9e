"""Padding removal: a packed forward gives the padded forward's hidden states at every real token, and gradients."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from hyflow.models.packing import forward_packed, pack_rows, use_varlen_attention, varlen_attention
from hyflow.models.tiny import build_tiny_model


def ragged_batch(vocab_size: int, seed: int = 0):
    """Left-padded prompts and right-padded responses of different lengths, as RL batches are."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens, response_lens, prompt_width, response_width = [3, 6, 1], [4, 1, 5], 6, 5
    rows = len(prompt_lens)
    input_ids = torch.randint(0, vocab_size, (rows, prompt_width + response_width), generator=g)
    prompt_mask = torch.arange(prompt_width)[None] >= prompt_width - torch.tensor(prompt_lens)[:, None]
    response_mask = torch.arange(response_width)[None] < torch.tensor(response_lens)[:, None]
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    return input_ids, attention_mask, position_ids


def test_varlen_attention_stays_inside_each_row_and_matches_per_row_causal_attention():
    g = torch.Generator().manual_seed(0)
    lengths = [3, 5, 2]
    q, k, v = (torch.randn(sum(lengths), h, 8, generator=g) for h in (4, 2, 2))
    cu_seqlens = torch.tensor([0, 3, 8, 10], dtype=torch.int32)
    out = varlen_attention(q, k, v, cu_seqlens, max_len=5)
    for start, end in [(0, 3), (3, 8), (8, 10)]:
        kk, vv = (x[start:end].repeat_interleave(2, dim=1).transpose(0, 1) for x in (k, v))
        expected = F.scaled_dot_product_attention(q[start:end].transpose(0, 1), kk, vv, is_causal=True)
        torch.testing.assert_close(out[start:end], expected.transpose(0, 1))


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_packed_forward_equals_padded_forward_at_real_tokens_with_the_same_gradients(tmp_path, arch):
    padded_model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / arch, arch=arch))
    packed_model = AutoModelForCausalLM.from_pretrained(tmp_path / arch)
    use_varlen_attention(packed_model)
    input_ids, attention_mask, position_ids = ragged_batch(padded_model.config.vocab_size)

    padded = padded_model.get_decoder()(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).last_hidden_state
    packed_rows = pack_rows(attention_mask)
    packed = forward_packed(packed_model.get_decoder(), input_ids, position_ids, packed_rows)

    assert packed.shape[0] == int(attention_mask.sum())
    torch.testing.assert_close(packed, packed_rows.gather(padded), rtol=1e-5, atol=1e-5)
    weights = torch.randn(packed.shape, generator=torch.Generator().manual_seed(1))  # a loss: Σ w ⊙ h
    (packed_rows.gather(padded) * weights).sum().backward()
    (packed * weights).sum().backward()
    for (name, p), q in zip(padded_model.named_parameters(), packed_model.parameters()):
        scale = p.grad.abs().max().item()  # fp32 sums in another order: compare relative to the largest entry
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4 * scale, msg=name)


def test_flat_index_finds_packed_positions_and_marks_padding():
    attention_mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    packed = pack_rows(attention_mask)
    rows, cols = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 1, 2])
    assert packed.flat_index(rows, cols).tolist() == [-1, 1, 3, -1]
    assert packed.cu_seqlens.tolist() == [0, 2, 4] and packed.max_len == 2


def test_pack_rows_finds_each_real_response_token_and_the_packed_token_that_predicts_it():
    _, attention_mask, _ = ragged_batch(vocab_size=10)
    response_length = 5
    packed = pack_rows(attention_mask, response_length)
    prompt_width = attention_mask.shape[1] - response_length
    real = [(b, r) for b in range(3) for r in range(response_length) if attention_mask[b, prompt_width + r]]
    assert list(zip(packed.response_rows.tolist(), packed.response_cols.tolist())) == real
    packed_position = {p: i for i, p in enumerate(packed.indices.tolist())}  # flat (b, t) → packed index
    width = attention_mask.shape[1]
    expected = [packed_position[b * width + prompt_width + r - 1] for b, r in real]
    assert packed.sources.tolist() == expected
    assert pack_rows(attention_mask).sources is None  # no response length, no response tokens


def test_a_response_token_with_no_real_token_before_it_is_a_clear_error():
    attention_mask = torch.tensor([[1, 1, 1, 0], [0, 0, 1, 1]])  # row 1: an empty prompt
    with pytest.raises(ValueError, match="no real token before it"):
        pack_rows(attention_mask, response_length=2)


def test_moving_a_packing_keeps_every_field_and_its_dtype():
    _, attention_mask, _ = ragged_batch(vocab_size=10)
    packed = pack_rows(attention_mask, response_length=5)
    assert packed.to(torch.device("cpu")) is packed  # already there: no copy
    moved = packed.to(torch.device("meta"))  # another device: one copy, split back into the fields
    assert moved.cu_seqlens.dtype == torch.int32 and moved.indices.dtype == torch.long
    assert [t.shape for t in (moved.indices, moved.cu_seqlens, moved.response_rows, moved.sources)] == [
        t.shape for t in (packed.indices, packed.cu_seqlens, packed.response_rows, packed.sources)
    ]
    assert (moved.max_len, moved.shape) == (packed.max_len, packed.shape)
