"""The controller's light math: response mask, KL penalty in the reward, advantages through the registry."""

import numpy as np
import pytest
import torch

from hyflow import fields as F
from hyflow.algorithms import AdaptiveKLController, FixedKLController, register_adv_est
from hyflow.protocol import DataProto
from hyflow.trainer.ppo_ops import apply_kl_penalty, compute_advantage, compute_response_mask, pf_ppo_resample


def _batch(rows: int = 4, prompt_len: int = 3, response_lens=(4, 2, 3, 1), response_width: int = 4) -> DataProto:
    generator = torch.Generator().manual_seed(0)
    prompt_mask = torch.ones(rows, prompt_len, dtype=torch.long)
    prompt_mask[0, 0] = 0  # left padding on the first prompt
    response_mask = torch.zeros(rows, response_width, dtype=torch.long)
    for row, length in enumerate(response_lens):
        response_mask[row, :length] = 1
    scores = torch.zeros(rows, response_width)
    for row, length in enumerate(response_lens):
        scores[row, length - 1] = float(row % 2)
    tensors = {
        F.PROMPTS: torch.randint(3, 50, (rows, prompt_len), generator=generator),
        F.RESPONSES: torch.randint(3, 50, (rows, response_width), generator=generator),
        F.ATTENTION_MASK: torch.cat([prompt_mask, response_mask], dim=1),
        F.TOKEN_LEVEL_SCORES: scores,
        F.OLD_LOG_PROBS: -torch.rand(rows, response_width, generator=generator),
        F.REF_LOG_PROB: -torch.rand(rows, response_width, generator=generator),
    }
    uids = np.array([f"p{row // 2}" for row in range(rows)], dtype=object)
    return DataProto.from_dict(tensors, {F.UID: uids})


def test_response_mask_is_the_response_part_of_the_attention_mask():
    data = _batch()
    mask = compute_response_mask(data)
    expected = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]])
    assert torch.equal(mask, expected)


def test_kl_penalty_subtracts_beta_times_k1_on_response_tokens_only():
    data = _batch()
    scores = data.batch[F.TOKEN_LEVEL_SCORES].clone()
    data, metrics = apply_kl_penalty(data, FixedKLController(kl_coef=0.5), kl_penalty="kl")
    mask = compute_response_mask(data).float()
    kl = (data.batch[F.OLD_LOG_PROBS] - data.batch[F.REF_LOG_PROB]) * mask
    expected = scores - 0.5 * kl
    assert torch.allclose(data.batch[F.TOKEN_LEVEL_REWARDS], expected)
    naive_mean_kl = np.mean([kl[i][mask[i] > 0].mean().item() for i in range(len(data))])
    assert float(metrics["actor/reward_kl_penalty"]) == pytest.approx(naive_mean_kl, rel=1e-5)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5


def test_adaptive_kl_controller_grows_its_coefficient_when_kl_is_above_target():
    data = _batch()
    data.batch[F.REF_LOG_PROB] = data.batch[F.OLD_LOG_PROBS] - 5.0  # a large KL
    controller = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.01, horizon=10)
    _, metrics = apply_kl_penalty(data, controller, kl_penalty="kl")
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    assert controller.value == pytest.approx(0.1 * (1 + 0.2 * len(data) / 10))


def test_kl_penalty_without_reference_log_probs_names_the_missing_field():
    data = _batch()
    data.pop(batch_keys=[F.REF_LOG_PROB])
    with pytest.raises(ValueError, match="ref_log_prob"):
        apply_kl_penalty(data, FixedKLController(kl_coef=0.1))


def test_grpo_advantage_through_the_registry_matches_a_naive_group_normalisation():
    data = _batch()
    data.batch[F.TOKEN_LEVEL_REWARDS] = data.batch[F.TOKEN_LEVEL_SCORES] * torch.tensor([[1.0], [1.0], [2.0], [1.0]])
    data = compute_advantage(data, "grpo", norm_adv_by_std_in_grpo=True)
    scores = data.batch[F.TOKEN_LEVEL_REWARDS].sum(-1)
    mask = data.batch[F.RESPONSE_MASK]
    for group in ([0, 1], [2, 3]):
        group_scores = scores[group]
        normalised = (group_scores - group_scores.mean()) / (group_scores.std() + 1e-6)
        for k, row in enumerate(group):
            assert torch.allclose(data.batch[F.ADVANTAGES][row], normalised[k] * mask[row])
    assert torch.equal(data.batch[F.RETURNS], data.batch[F.ADVANTAGES])


def test_gae_advantage_reads_the_critic_values_from_the_batch():
    data = _batch(response_lens=(4, 4, 4, 4))
    data.batch[F.TOKEN_LEVEL_REWARDS] = data.batch[F.TOKEN_LEVEL_SCORES]
    data.batch[F.VALUES] = torch.zeros(4, 4)
    data = compute_advantage(data, "gae", gamma=1.0, lam=1.0)
    # with zero values and γ = λ = 1 the return of every token is the final score
    expected_returns = data.batch[F.TOKEN_LEVEL_SCORES].sum(-1, keepdim=True).expand(4, 4)
    assert torch.allclose(data.batch[F.RETURNS], expected_returns)


def test_gae_without_values_says_a_critic_is_needed():
    data = _batch()
    data.batch[F.TOKEN_LEVEL_REWARDS] = data.batch[F.TOKEN_LEVEL_SCORES]
    with pytest.raises(ValueError, match="critic"):
        compute_advantage(data, "gae")


def test_group_estimator_without_uid_names_the_uid_field():
    data = _batch()
    data.batch[F.TOKEN_LEVEL_REWARDS] = data.batch[F.TOKEN_LEVEL_SCORES]
    data.pop(non_tensor_batch_keys=[F.UID])
    with pytest.raises(ValueError, match="uid"):
        compute_advantage(data, "rloo")


def test_user_estimator_without_kwargs_gets_only_the_arguments_it_names():
    seen = {}

    @register_adv_est("test_ppo_ops_sum_estimator")
    def sum_estimator(token_level_rewards, response_mask, num_repeat):
        seen["num_repeat"] = num_repeat
        advantages = token_level_rewards.sum(-1, keepdim=True) * response_mask
        return advantages, advantages

    data = _batch()
    data.batch[F.TOKEN_LEVEL_REWARDS] = data.batch[F.TOKEN_LEVEL_SCORES]
    data = compute_advantage(data, "test_ppo_ops_sum_estimator", num_repeat=2)
    assert seen["num_repeat"] == 2
    assert torch.equal(data.batch[F.ADVANTAGES][1], torch.tensor([1.0, 1.0, 0.0, 0.0]))


def test_advantage_without_token_level_rewards_names_the_field():
    with pytest.raises(ValueError, match="token_level_rewards"):
        compute_advantage(_batch(), "grpo")


def test_pf_ppo_resamples_whole_rows_toward_the_rewarded_ones():
    data = _batch()  # rows 1 and 3 score 1, rows 0 and 2 score 0
    torch.manual_seed(0)

    resampled = pf_ppo_resample(data, "pow", 2.0)

    assert len(resampled) == len(data)
    picked = [int(torch.nonzero((data.batch[F.RESPONSES] == row).all(-1))[0]) for row in resampled.batch[F.RESPONSES]]
    assert set(picked) <= {1, 3}  # |0| ** 2 = 0: unrewarded rows are (almost surely) never drawn
    assert list(resampled.non_tensor_batch[F.UID]) == [data.non_tensor_batch[F.UID][i] for i in picked]
