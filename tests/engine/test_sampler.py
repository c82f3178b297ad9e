"""The batched sampler: top-k/top-p filtering equals a naive per-row version, Gumbel-max draws follow softmax,
and a row's randomness depends only on its own seed and counter."""

from __future__ import annotations

import torch

from hyflow.engine.sampler import SamplingTensors, filter_top_k_top_p, gumbel_noise, sample


def _naive_filter(row: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """Reference: keep the k best, then the smallest prefix (by probability) whose mass reaches p."""
    order = row.argsort(descending=True).tolist()
    keep = order[:k] if k > 0 else order
    probs = row[keep].softmax(-1).tolist()
    kept, mass = [], 0.0
    for token, prob in zip(keep, probs):
        if mass >= p:
            break
        kept.append(token)
        mass += prob
    out = torch.full_like(row, float("-inf"))
    out[kept] = row[kept]
    return out


def test_top_k_top_p_filter_equals_the_naive_per_row_version():
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    top_k = torch.tensor([-1, 5, 0, 20, 1, 50])
    top_p = torch.tensor([1.0, 1.0, 0.5, 0.8, 0.9, 0.05])
    filtered = filter_top_k_top_p(logits, top_k, top_p)
    for i in range(6):
        assert torch.equal(filtered[i], _naive_filter(logits[i], int(top_k[i]), float(top_p[i])))


def test_gumbel_max_draws_follow_the_softmax_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    draws = 20000
    noise = gumbel_noise(torch.full((draws,), 123), torch.arange(draws), 5)
    tokens = (logits.log_softmax(-1) + noise).argmax(-1)
    frequencies = torch.bincount(tokens, minlength=5).float() / draws
    torch.testing.assert_close(frequencies, logits.softmax(-1)[0], atol=0.015, rtol=0)


def test_a_rows_noise_depends_only_on_its_seed_and_counter():
    alone = gumbel_noise(torch.tensor([7]), torch.tensor([3]), 64)
    batched = gumbel_noise(torch.tensor([1, 7, 9]), torch.tensor([0, 3, 5]), 64)
    assert torch.equal(alone[0], batched[1])
    assert not torch.equal(batched[0], batched[1])


def test_greedy_rows_take_the_argmax_and_report_log_softmax_log_probs():
    torch.manual_seed(1)
    logits = torch.randn(3, 20)
    st = SamplingTensors(
        temperatures=torch.tensor([0.0, 0.0, 0.0]),
        top_k=torch.tensor([-1, -1, -1]),
        top_p=torch.ones(3),
        seeds=torch.tensor([1, 2, 3]),
        counters=torch.zeros(3, dtype=torch.long),
        need_filter=False,
        need_raw=True,
    )
    tokens, log_probs, raw = sample(logits, st)
    assert torch.equal(tokens, logits.argmax(-1))
    expected = logits.log_softmax(-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(log_probs, expected)
    torch.testing.assert_close(raw, expected)
