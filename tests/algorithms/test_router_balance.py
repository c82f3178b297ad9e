"""The MoE router's load-balancing loss against a naive loop over layers, tokens and slots, and against
transformers' own `load_balancing_loss_func`."""

import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from hyflow.algorithms import expert_load, load_balancing_loss


def naive_load_balancing_loss(logits, indices, weights):
    """E · Σ_e f_e · P_e written out token by token."""
    num_layers, num_tokens, num_experts = logits.shape
    counts, prob_sums, total = [0.0] * num_experts, [0.0] * num_experts, 0.0
    for layer in range(num_layers):
        for t in range(num_tokens):
            w = float(weights[t])
            total += w
            probs = torch.softmax(logits[layer, t].double(), dim=-1)
            for e in range(num_experts):
                prob_sums[e] += w * float(probs[e])
            for e in indices[layer, t].tolist():
                counts[e] += w
    return num_experts * sum((counts[e] / total) * (prob_sums[e] / total) for e in range(num_experts))


def routed(num_layers=3, num_tokens=7, num_experts=5, top_k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_layers, num_tokens, num_experts, generator=g)
    indices = torch.topk(logits, top_k, dim=-1).indices
    return logits, indices


def test_load_balancing_loss_equals_the_naive_sum_over_layers_tokens_and_slots():
    logits, indices = routed()
    weights = torch.tensor([1.0, 1, 0, 1, 1, 0, 1])
    got = load_balancing_loss(logits, indices, weights)
    assert abs(float(got) - naive_load_balancing_loss(logits, indices, weights)) < 1e-5


def test_load_balancing_loss_equals_transformers_load_balancing_loss_func_with_an_attention_mask():
    logits, indices = routed(num_tokens=8)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    expected = load_balancing_loss_func(tuple(logits), num_experts=5, top_k=2, attention_mask=mask)
    torch.testing.assert_close(load_balancing_loss(logits, indices, mask.reshape(-1)), expected.float())


def test_load_balancing_loss_is_top_k_for_perfectly_balanced_routing():
    logits = torch.zeros(1, 4, 4)  # uniform probabilities
    indices = torch.tensor([[[0, 1], [2, 3], [0, 1], [2, 3]]])
    torch.testing.assert_close(load_balancing_loss(logits, indices, torch.ones(4)), torch.tensor(2.0))


def test_load_balancing_loss_gradient_lowers_the_probability_of_the_overloaded_expert():
    logits, _ = routed(num_layers=1, num_tokens=6, num_experts=3)
    logits.requires_grad_(True)
    indices = torch.zeros(1, 6, 1, dtype=torch.long)  # every token routed to expert 0
    load_balancing_loss(logits, indices, torch.ones(6)).backward()
    assert (logits.grad[..., 0] > 0).all()  # descent lowers expert 0's logit everywhere


def test_expert_load_counts_weighted_assignments_per_layer():
    indices = torch.tensor([[[0, 1], [1, 2], [1, 0]], [[2, 2], [0, 1], [2, 1]]])
    load = expert_load(indices, torch.tensor([1.0, 0.0, 1.0]), num_experts=3)
    torch.testing.assert_close(load, torch.tensor([[2.0, 2.0, 0.0], [0.0, 1.0, 3.0]]))
