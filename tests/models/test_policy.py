"""The chunked LM head's log-probs and entropy equal autograd through a plain full log-softmax (CPU reference path)."""

import pytest
import torch

from hyflow.models.policy import DEFAULT_CHUNK_SIZE, FUSED_CHUNK_BYTES, default_chunk_size, log_probs_from_hidden


def naive_log_probs_and_entropy(hidden, weight, bias, labels, temperature):
    """The obvious way: full fp32 logits, log_softmax, gather, and H = −Σ p log p."""
    logits = (hidden @ weight.t() + bias).float() / temperature
    log_softmax = torch.log_softmax(logits, dim=-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(dim=-1)
    return log_softmax.gather(-1, labels[:, None]).squeeze(-1), entropy


def lm_head_inputs(seed=0, num_positions=23, hidden_size=16, vocab_size=51):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_positions, hidden_size, generator=g).requires_grad_()
    weight = (torch.randn(vocab_size, hidden_size, generator=g) * 0.5).requires_grad_()
    bias = torch.randn(vocab_size, generator=g).requires_grad_()
    labels = torch.randint(0, vocab_size, (num_positions,), generator=g)
    return hidden, weight, bias, labels


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("compute_entropy", [False, True])
def test_log_probs_from_hidden_match_autograd_of_a_full_log_softmax(temperature, compute_entropy):
    hidden, weight, bias, labels = lm_head_inputs()
    g = torch.Generator().manual_seed(1)
    grad_log_probs, grad_entropy = torch.randn(len(labels), generator=g), torch.randn(len(labels), generator=g)

    def loss_of(log_probs, entropy):
        return (log_probs * grad_log_probs).sum() + ((entropy * grad_entropy).sum() if compute_entropy else 0)

    log_probs, entropy = log_probs_from_hidden(hidden, weight, labels, temperature, compute_entropy, 7, bias)
    grads = torch.autograd.grad(loss_of(log_probs, entropy), [hidden, weight, bias])
    want_log_probs, want_entropy = naive_log_probs_and_entropy(hidden, weight, bias, labels, temperature)
    want_grads = torch.autograd.grad(loss_of(want_log_probs, want_entropy), [hidden, weight, bias])

    torch.testing.assert_close(log_probs, want_log_probs, atol=1e-5, rtol=1e-5)
    if compute_entropy:
        torch.testing.assert_close(entropy, want_entropy, atol=1e-5, rtol=1e-5)
    else:
        assert torch.count_nonzero(entropy) == 0
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_log_probs_do_not_depend_on_the_chunk_size():
    hidden, weight, bias, labels = lm_head_inputs(seed=3)
    results = []
    for chunk_size in (1, 5, 1000, None):
        log_probs, entropy = log_probs_from_hidden(hidden, weight, labels, 0.8, True, chunk_size, bias)
        grad_hidden = torch.autograd.grad((log_probs + entropy).sum(), hidden)[0]
        results.append((log_probs, entropy, grad_hidden))
    for other in results[1:]:
        for got, want in zip(other, results[0], strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_fused_chunk_holds_one_buffer_budget_of_logits_and_the_reference_keeps_its_chunk():
    rows = default_chunk_size(151936, torch.bfloat16, fused=True)
    assert rows % 128 == 0 and rows * 151936 * 2 <= FUSED_CHUNK_BYTES < (rows + 128) * 151936 * 2
    assert default_chunk_size(10**9, torch.bfloat16, fused=True) == 128
    assert default_chunk_size(151936, torch.bfloat16, fused=False) == DEFAULT_CHUNK_SIZE
