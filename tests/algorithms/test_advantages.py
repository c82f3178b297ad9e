import math

import pytest
import torch

from hyflow.algorithms import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    fold_masked_rewards,
    get_adv_estimator_fn,
)


def naive_whiten(rows, masks):
    valid = [v for row, mask in zip(rows, masks) for v, m in zip(row, mask) if m]
    mean = sum(valid) / len(valid)
    var = sum((v - mean) ** 2 for v in valid) / (len(valid) - 1)
    return [
        [(v - mean) / math.sqrt(var + 1e-8) if m else 0.0 for v, m in zip(row, mask)] for row, mask in zip(rows, masks)
    ]


def naive_fold(rewards, mask):
    folded, last = [0.0] * len(rewards), None
    for t, (r, m) in enumerate(zip(rewards, mask)):
        if m:
            last = t
        if last is not None:
            folded[last] += r
    return folded


def naive_gae(rewards, values, masks, gamma, lam):
    """Per sequence, over its model tokens only; returns unwhitened advantages and returns at model tokens."""
    all_adv, all_ret = [], []
    for r_row, v_row, m_row in zip(rewards, values, masks):
        r_row = naive_fold(r_row, m_row)
        steps = [t for t, m in enumerate(m_row) if m]
        adv, ret = [0.0] * len(m_row), [0.0] * len(m_row)
        next_value, next_adv = 0.0, 0.0
        for t in reversed(steps):
            delta = r_row[t] + gamma * next_value - v_row[t]
            next_adv = delta + gamma * lam * next_adv
            next_value = v_row[t]
            adv[t], ret[t] = next_adv, next_adv + v_row[t]
        all_adv.append(adv)
        all_ret.append(ret)
    return all_adv, all_ret


def _mask(lengths, length, holes=()):
    mask = (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]).float()
    for row, col in holes:
        mask[row, col] = 0.0
    return mask


def test_gae_matches_a_per_token_loop_and_whitens_only_advantages():
    torch.manual_seed(0)
    rewards, values = torch.randn(3, 6), torch.randn(3, 6)
    mask = _mask([6, 4, 5], 6, holes=[(0, 2), (2, 1)])
    advantages, returns = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    naive_adv, naive_ret = naive_gae(rewards.tolist(), values.tolist(), mask.tolist(), 0.9, 0.8)
    expected_adv = torch.tensor(naive_whiten(naive_adv, mask.tolist()))
    assert torch.allclose(advantages * mask, expected_adv, atol=1e-5)
    assert torch.allclose(returns * mask, torch.tensor(naive_ret), atol=1e-5)


def test_gae_with_a_masked_hole_equals_gae_on_the_sequence_with_the_hole_removed():
    torch.manual_seed(1)
    rewards, values = torch.randn(2, 7), torch.randn(2, 7)
    mask = _mask([7, 5], 7, holes=[(0, 2), (0, 3), (1, 1)])
    rewards = rewards * mask  # tool tokens carry no reward of their own
    kept = [mask[row].nonzero().squeeze(-1) for row in range(2)]
    compact_rewards, compact_values = torch.zeros(2, 7), torch.zeros(2, 7)
    for row, idx in enumerate(kept):
        compact_rewards[row, : len(idx)] = rewards[row, idx]
        compact_values[row, : len(idx)] = values[row, idx]
    compact_mask = _mask([len(idx) for idx in kept], 7)
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.95, lam=0.9)
    compact_adv, compact_ret = compute_gae_advantage_return(
        compact_rewards, compact_values, compact_mask, gamma=0.95, lam=0.9
    )
    for row, idx in enumerate(kept):
        assert torch.allclose(adv[row, idx], compact_adv[row, : len(idx)], atol=1e-5)
        assert torch.allclose(ret[row, idx], compact_ret[row, : len(idx)], atol=1e-5)


def test_gae_masked_positions_carry_the_next_model_tokens_return():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 9.0, 9.0, 0.2]])
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    _, returns = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    # advantage at t=3 is 1 - 0.2; the hole carries it; t=0: 0 + 0.2 - 0.5 + 0.8 = 0.5
    assert torch.allclose(returns[0, [0, 3]], torch.tensor([1.0, 1.0]))


def test_a_reward_on_a_masked_position_is_credited_to_the_model_token_before_it():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    assert torch.equal(fold_masked_rewards(rewards, mask), torch.tensor([[0.0, 2.0, 0.0, 0.0]]))
    _, returns = compute_gae_advantage_return(rewards, torch.zeros(1, 4), mask, gamma=1.0, lam=1.0)
    assert torch.allclose(returns[0, :2], torch.tensor([2.0, 2.0]))


def test_gae_without_values_raises_a_helpful_error():
    with pytest.raises(ValueError, match="critic"):
        compute_gae_advantage_return(torch.zeros(1, 2), None, torch.ones(1, 2), gamma=1.0, lam=1.0)


def test_gae_reads_gamma_and_lam_from_the_algorithm_config_when_not_given():
    from types import SimpleNamespace

    torch.manual_seed(2)
    rewards, values, mask = torch.randn(2, 4), torch.randn(2, 4), torch.ones(2, 4)
    explicit = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.7)
    from_config = get_adv_estimator_fn("gae")(
        token_level_rewards=rewards, values=values, response_mask=mask, config=SimpleNamespace(gamma=0.9, lam=0.7)
    )
    assert torch.equal(explicit[0], from_config[0])
    with pytest.raises(ValueError, match="gamma"):
        compute_gae_advantage_return(rewards, values, mask)


def test_reinforce_plus_plus_whitens_the_discounted_return_to_go_over_model_tokens():
    torch.manual_seed(3)
    rewards = torch.randn(3, 5)
    mask = _mask([5, 3, 4], 5, holes=[(0, 1)])
    advantages, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.9)
    naive_returns = []
    for r_row, m_row in zip(rewards.tolist(), mask.tolist()):
        r_row, running, row = naive_fold(r_row, m_row), 0.0, [0.0] * len(m_row)
        for t in reversed([t for t, m in enumerate(m_row) if m]):
            running = r_row[t] + 0.9 * running
            row[t] = running
        naive_returns.append(row)
    assert torch.allclose(returns, torch.tensor(naive_returns), atol=1e-5)  # 0 where the mask is 0
    assert torch.allclose(advantages, torch.tensor(naive_whiten(naive_returns, mask.tolist())), atol=1e-5)


def test_reinforce_plus_plus_carries_the_return_across_a_tool_span_and_gives_the_span_none():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    _, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    assert returns.tolist() == [[0.5, 1.0, 0.0, 0.0, 2.0]]


def test_remax_subtracts_the_greedy_baseline_from_the_return_to_go():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    mask = _mask([3, 2], 4)
    baselines = torch.tensor([0.25, 1.0])
    advantages, returns = compute_remax_outcome_advantage(rewards, baselines, mask)
    for row in range(2):
        for t in range(4):
            expected_return = sum(rewards[row, t:].tolist()) if mask[row, t] else 0.0
            assert math.isclose(returns[row, t].item(), expected_return, abs_tol=1e-6)
            expected_adv = expected_return - baselines[row].item() if mask[row, t] else 0.0
            assert math.isclose(advantages[row, t].item(), expected_adv, abs_tol=1e-6)
    with pytest.raises(ValueError, match="reward_baselines"):
        compute_remax_outcome_advantage(rewards, None, mask)


def test_estimators_run_without_building_a_graph():
    rewards = torch.randn(2, 3, requires_grad=True)
    values = torch.randn(2, 3, requires_grad=True)
    advantages, returns = compute_gae_advantage_return(rewards, values, torch.ones(2, 3), gamma=1.0, lam=1.0)
    assert not advantages.requires_grad and not returns.requires_grad
