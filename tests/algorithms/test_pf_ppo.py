"""PF-PPO's weights and its resampling of the batch by reward."""

import pytest
import torch

from hyflow.algorithms.pf_ppo import pf_ppo_sample_indices, pf_ppo_weights


def test_the_weights_follow_each_reweight_method():
    scores = torch.tensor([-2.0, 0.0, 1.0, 3.0])

    assert torch.equal(pf_ppo_weights(scores, "pow", 2.0), torch.tensor([4.0, 0.0, 1.0, 9.0]))
    assert torch.equal(pf_ppo_weights(scores, "max_min", 2.0), torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert torch.allclose(pf_ppo_weights(scores, "max_random", 2.0), torch.tensor([0.1, 0.1, 0.1, 0.4]))


def test_resampling_keeps_the_batch_size_and_draws_only_rows_with_weight():
    scores = torch.tensor([0.0, 0.0, 1.0, 0.0])  # max_min: rows 0, 1, 3 share the minimum, row 2 is the maximum
    generator = torch.Generator().manual_seed(0)

    indices = pf_ppo_sample_indices(torch.tensor([0.0, 0.0, 5.0, 0.0]), "pow", 2.0, generator=generator)

    assert indices.shape == (4,) and set(indices.tolist()) == {2}  # 25 vs 1e-8: only the rewarded row
    assert set(pf_ppo_sample_indices(scores, "max_min", generator=generator).tolist()) <= {0, 1, 2, 3}


def test_an_unknown_reweight_method_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"algorithm.pf_ppo.reweight_method='top'.*'pow', 'max_min', 'max_random'"):
        pf_ppo_weights(torch.zeros(2), "top", 2.0)
