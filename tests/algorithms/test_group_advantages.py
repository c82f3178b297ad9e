import math
import statistics
from collections import defaultdict

import numpy as np
import pytest
import torch

from hyflow.algorithms import (
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
)


def _groups(index):
    groups = defaultdict(list)
    for i, uid in enumerate(index):
        groups[uid].append(i)
    return groups


def _batch(seed=0):
    """8 responses in groups of 3, 3, 1 and 1 (uids interleaved), right-padded to 5 tokens."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 6, (8,), generator=generator)
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(8, 5)
    rewards[torch.arange(8), lengths - 1] = torch.randn(8, generator=generator)
    index = np.array(["a", "b", "a", "c", "b", "a", "b", "d"], dtype=object)
    return rewards, mask, index


def _expand(per_response, mask):
    return torch.tensor(per_response, dtype=torch.float32)[:, None] * mask


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_a_loop_over_groups_with_unbiased_std(norm_by_std):
    rewards, mask, index = _batch()
    scores = rewards.sum(-1).tolist()
    expected = [0.0] * 8
    for members in _groups(index).values():
        group = [scores[i] for i in members]
        mean, std = (statistics.mean(group), statistics.stdev(group)) if len(group) > 1 else (0.0, 1.0)
        for i in members:
            expected[i] = (scores[i] - mean) / (std + 1e-6) if norm_by_std else scores[i] - mean
    advantages, returns = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm_by_std)
    assert torch.allclose(advantages, _expand(expected, mask), atol=1e-5)
    assert torch.equal(advantages, returns)


def test_grpo_gives_zero_advantage_when_all_rewards_in_a_group_are_equal():
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = torch.tensor([1.0, 1.0, 0.5, 0.5])
    advantages, _ = compute_grpo_outcome_advantage(rewards, torch.ones(4, 3), np.array([7, 7, 9, 9]))
    assert torch.equal(advantages, torch.zeros(4, 3))


def test_grpo_uses_mean_zero_and_std_one_for_a_group_of_one_sample():
    rewards = torch.tensor([[0.0, 0.8]])
    advantages, _ = compute_grpo_outcome_advantage(rewards, torch.ones(1, 2), np.array(["solo"], dtype=object))
    assert torch.allclose(advantages, torch.full((1, 2), 0.8 / (1 + 1e-6)))


def test_dr_grpo_only_subtracts_the_group_mean():
    rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    advantages, _ = get_adv_estimator_fn("grpo")(
        token_level_rewards=rewards,
        response_mask=torch.ones(4, 1),
        index=np.arange(4) // 4,
        norm_adv_by_std_in_grpo=False,
    )
    assert torch.allclose(advantages.squeeze(-1), torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_rloo_subtracts_the_mean_of_the_other_samples_of_the_group():
    rewards, mask, index = _batch(seed=1)
    scores = rewards.sum(-1).tolist()
    expected = list(scores)
    for members in _groups(index).values():
        for i in members:
            others = [scores[j] for j in members if j != i]
            if others:
                expected[i] = scores[i] - sum(others) / len(others)
    advantages, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    assert torch.allclose(advantages, _expand(expected, mask), atol=1e-5)


def test_reinforce_plus_plus_baseline_subtracts_the_group_mean_then_whitens_over_the_batch():
    rewards, mask, index = _batch(seed=2)
    scores = rewards.sum(-1).tolist()
    centred = list(scores)
    for members in _groups(index).values():
        if len(members) > 1:
            mean = statistics.mean(scores[i] for i in members)
            for i in members:
                centred[i] = scores[i] - mean
    tokens = [centred[i] for i in range(8) for _ in range(int(mask[i].sum()))]
    mean, std = statistics.mean(tokens), math.sqrt(statistics.variance(tokens) + 1e-8)
    expected = [(c - mean) / std for c in centred]
    advantages, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index)
    assert torch.allclose(advantages, _expand(expected, mask), atol=1e-5)


def test_opo_uses_the_length_weighted_group_mean_as_baseline():
    rewards, mask, index = _batch(seed=3)
    scores, lengths = rewards.sum(-1).tolist(), mask.sum(-1).tolist()
    expected = list(scores)
    for members in _groups(index).values():
        if len(members) > 1:
            baseline = sum(lengths[i] * scores[i] for i in members) / sum(lengths[i] for i in members)
            for i in members:
                expected[i] = scores[i] - baseline
    advantages, _ = compute_opo_outcome_advantage(rewards, mask, index)
    assert torch.allclose(advantages, _expand(expected, mask), atol=1e-5)


def test_gpg_rescales_the_group_centred_score_by_the_share_of_nonzero_scores():
    rewards, mask, index = _batch(seed=4)
    rewards[0] = 0.0
    rewards[3] = 0.0
    scores = rewards.sum(-1).tolist()
    alpha = len(scores) / sum(1 for s in scores if s != 0)
    expected = list(scores)
    for members in _groups(index).values():
        mean = statistics.mean(scores[i] for i in members) if len(members) > 1 else 0.0
        for i in members:
            expected[i] = alpha * (scores[i] - mean) / 2.0
    advantages, _ = compute_gpg_outcome_advantage(rewards, mask, index, f_norm=2.0)
    assert torch.allclose(advantages, _expand(expected, mask), atol=1e-5)


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_passk_credits_only_the_best_response_with_its_margin(norm_by_std):
    scores = [0.2, 0.9, 0.5, 1.0, 1.0, 0.0]
    index = np.array([0, 0, 0, 1, 1, 1])
    rewards = torch.tensor(scores)[:, None].repeat(1, 2) * torch.tensor([0.0, 1.0])
    mask = torch.ones(6, 2)
    advantages, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm_by_std)
    expected = [0.0] * 6
    for members in _groups(index).values():
        group = [scores[i] for i in members]
        best = members[group.index(max(group))]
        margin = sorted(group)[-1] - sorted(group)[-2]
        expected[best] = margin / (statistics.stdev(group) + 1e-6) if norm_by_std else margin
    assert torch.allclose(advantages, _expand(expected, mask), atol=1e-5)


def test_grpo_passk_rejects_groups_of_one_sample():
    with pytest.raises(ValueError, match=r"rollout\.n >= 2"):
        compute_grpo_passk_outcome_advantage(torch.ones(2, 2), torch.ones(2, 2), np.array(["a", "b"], dtype=object))


def test_group_index_may_be_a_list_or_a_tensor():
    rewards, mask, index = _batch(seed=5)
    from_array, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    as_ints = [ord(u) for u in index]
    assert torch.equal(compute_grpo_outcome_advantage(rewards, mask, as_ints)[0], from_array)
    assert torch.equal(compute_grpo_outcome_advantage(rewards, mask, torch.tensor(as_ints))[0], from_array)
