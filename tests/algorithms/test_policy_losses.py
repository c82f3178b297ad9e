import math

import pytest
import torch

from hyflow.algorithms import (
    LOSS_AGG_MODES,
    compute_policy_loss_cispo,
    compute_policy_loss_dro,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
)


def naive_ppo_token_loss(old, new, adv, eps_low, eps_high, clip_c):
    ratio = math.exp(new - old)
    clip_loss = max(-adv * ratio, -adv * min(max(ratio, 1 - eps_low), 1 + eps_high))
    return min(clip_loss, -adv * clip_c) if adv < 0 else clip_loss


def _inputs(seed=0, batch=4, length=5):
    generator = torch.Generator().manual_seed(seed)
    old = torch.randn(batch, length, generator=generator) - 1.0
    new = old + 0.5 * torch.randn(batch, length, generator=generator)
    adv = torch.randn(batch, length, generator=generator)
    mask = (torch.rand(batch, length, generator=generator) > 0.25).float()
    return old, new, adv, mask


@pytest.mark.parametrize(("low", "high"), [(None, None), (0.2, 0.28), (0.1, 0.3)])
def test_vanilla_matches_a_per_token_loop(actor_config, low, high):
    old, new, adv, mask = _inputs()
    config = actor_config(clip_ratio_low=low, clip_ratio_high=high)
    loss, metrics = compute_policy_loss_vanilla(old, new, adv, mask, "token-mean", config)
    eps_low, eps_high = low or 0.2, high or 0.2
    losses, clipped = [], []
    for o, n, a, m in zip(old.flatten().tolist(), new.flatten().tolist(), adv.flatten().tolist(), mask.flatten()):
        if m:
            losses.append(naive_ppo_token_loss(o, n, a, eps_low, eps_high, 3.0))
            ratio = math.exp(n - o)
            clipped.append(-a * min(max(ratio, 1 - eps_low), 1 + eps_high) > -a * ratio)
    assert math.isclose(loss.item(), sum(losses) / len(losses), rel_tol=1e-5)
    assert math.isclose(metrics["pg_clipfrac"].item(), sum(clipped) / len(clipped), rel_tol=1e-5)
    assert math.isclose(metrics["ppo_kl"].item(), ((old - new) * mask).sum().item() / mask.sum().item(), rel_tol=1e-5)


def test_dual_clip_bounds_the_loss_of_negative_advantages_by_clip_ratio_c(actor_config):
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[10.0, 10.0]]))  # ratio 10, far above 1 + eps
    adv = torch.tensor([[-1.0, 1.0]])
    loss, metrics = compute_policy_loss_vanilla(old, new, adv, torch.ones(1, 2), "seq-mean-token-sum", actor_config())
    # negative advantage: min(max(10, 1.2), 3) = 3; positive: max(-10, -1.2) = -1.2
    assert math.isclose(loss.item(), 3.0 - 1.2, rel_tol=1e-5)
    assert metrics["pg_clipfrac_lower"].item() == 0.5


def test_dual_clip_bound_must_exceed_one(actor_config):
    with pytest.raises(ValueError, match=r"clip_ratio_c=0\.5.*greater than 1\.0"):
        compute_policy_loss_vanilla(*_inputs(), "token-mean", actor_config(clip_ratio_c=0.5))


def test_clip_higher_lets_positive_advantages_raise_the_ratio_further(actor_config):
    old, new, adv, mask = torch.zeros(1, 1), torch.log(torch.tensor([[1.25]])), torch.ones(1, 1), torch.ones(1, 1)
    new.requires_grad_(True)
    symmetric, _ = compute_policy_loss_vanilla(old, new, adv, mask, "token-mean", actor_config())
    (symmetric_grad,) = torch.autograd.grad(symmetric, new)
    higher, metrics = compute_policy_loss_vanilla(old, new, adv, mask, "token-mean", actor_config(clip_ratio_high=0.28))
    (higher_grad,) = torch.autograd.grad(higher, new)
    assert symmetric_grad.item() == 0.0  # clipped at 1.2: no gradient
    assert math.isclose(higher_grad.item(), -1.25, rel_tol=1e-5)  # d(-ratio)/d(log_prob) = -ratio
    assert metrics["pg_clipfrac"].item() == 0.0


@pytest.mark.parametrize("loss_name", ["vanilla", "gspo", "gpg", "cispo"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_policy_losses_summed_over_micro_batches_with_global_counts_equal_the_full_batch(actor_config, loss_name, mode):
    old, new, adv, mask = _inputs(seed=1, batch=6)
    mask[0, 0] = 1.0  # every row keeps a valid token so both seq counts agree
    fn = get_policy_loss_fn(loss_name)
    full, _ = fn(old, new, adv, mask, mode, actor_config())
    counts = {"batch_num_tokens": mask.sum(), "global_batch_size": (mask.sum(-1) > 0).sum()}
    parts = [
        fn(old[i : i + 2], new[i : i + 2], adv[i : i + 2], mask[i : i + 2], mode, actor_config(), **counts)[0]
        for i in (0, 2, 4)
    ]
    assert torch.allclose(sum(parts), full, rtol=1e-5, atol=1e-6)


def test_rollout_importance_weights_multiply_the_token_losses(actor_config):
    old, new, adv, mask = _inputs(seed=2)
    weights = torch.rand_like(old)
    plain, _ = compute_policy_loss_vanilla(old, new, adv, mask, "seq-mean-token-sum", actor_config())
    weighted, _ = compute_policy_loss_vanilla(
        old, new, adv, mask, "seq-mean-token-sum", actor_config(), rollout_is_weights=weights, rollout_log_probs=old
    )
    unit, _ = compute_policy_loss_vanilla(
        old, new, adv, mask, "seq-mean-token-sum", actor_config(), rollout_is_weights=torch.ones_like(old)
    )
    assert torch.allclose(unit, plain)
    assert not torch.allclose(weighted, plain)


def test_gspo_gradient_is_that_of_the_length_normalised_sequence_ratio(actor_config):
    old, new, _, mask = _inputs(seed=3, batch=3)
    new = (old + 0.01 * (new - old)).requires_grad_(True)  # stay inside the clip range
    seq_adv = torch.tensor([1.0, -0.5, 2.0])
    adv = seq_adv[:, None].expand_as(old)
    loss, metrics = compute_policy_loss_gspo(old, new, adv, mask, "seq-mean-token-mean", actor_config())
    (grad,) = torch.autograd.grad(loss, new)
    new_ref = new.detach().clone().requires_grad_(True)
    seq_ratio = torch.exp(((new_ref - old) * mask).sum(-1) / mask.sum(-1))
    reference = (-seq_adv * seq_ratio).mean()
    (ref_grad,) = torch.autograd.grad(reference, new_ref)
    assert torch.allclose(loss, reference, atol=1e-6)
    assert torch.allclose(grad * mask, ref_grad * mask, atol=1e-6)
    assert metrics["pg_clipfrac"].item() == 0.0


def test_gpg_loss_is_minus_advantage_times_log_prob(actor_config):
    old, new, adv, mask = _inputs(seed=4)
    loss, metrics = compute_policy_loss_gpg(old, new, adv, mask, "token-mean", actor_config())
    expected = sum(-a * n for a, n, m in zip(adv.flatten().tolist(), new.flatten().tolist(), mask.flatten()) if m)
    assert math.isclose(loss.item(), expected / mask.sum().item(), rel_tol=1e-5)
    assert metrics["pg_clipfrac"].item() == 0.0


def test_cispo_clips_the_weight_but_keeps_every_tokens_gradient(actor_config):
    old = torch.zeros(1, 3)
    ratio = torch.tensor([[0.5, 1.0, 2.0]])
    new = torch.log(ratio).requires_grad_(True)
    adv, mask = torch.tensor([[1.0, 1.0, 1.0]]), torch.ones(1, 3)
    loss, metrics = compute_policy_loss_cispo(old, new, adv, mask, "seq-mean-token-sum", actor_config())
    (grad,) = torch.autograd.grad(loss, new)
    assert torch.allclose(grad, -torch.tensor([[0.8, 1.0, 1.2]]))  # -clip(ratio, 0.8, 1.2) * A
    assert math.isclose(metrics["pg_clipfrac"].item(), 2 / 3, rel_tol=1e-6)
    assert math.isclose(metrics["pg_clipfrac_lower"].item(), 1 / 3, rel_tol=1e-6)


def test_policy_losses_need_the_clip_ratio_and_say_which_key_is_missing():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.clip_ratio"):
        compute_policy_loss_vanilla(*_inputs(), "token-mean", object())


def test_metrics_are_detached_tensors(actor_config):
    old, new, adv, mask = _inputs(seed=5)
    new.requires_grad_(True)
    for name in ("vanilla", "gspo", "gpg", "cispo"):
        _, metrics = get_policy_loss_fn(name)(old, new, adv, mask, "token-mean", actor_config())
        assert set(metrics) == {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}
        assert all(isinstance(v, torch.Tensor) and not v.requires_grad for v in metrics.values())


def test_dro_is_the_policy_gradient_minus_a_squared_log_ratio_penalty(actor_config):
    old, new, adv, mask = _inputs(seed=6)
    config = actor_config(dro_beta=0.1)
    loss, metrics = compute_policy_loss_dro(old, new, adv, mask, "token-mean", config)
    per_token = [
        -(n * a - 0.05 * (n - o) ** 2)
        for o, n, a, m in zip(*(t.flatten().tolist() for t in (old, new, adv, mask)))
        if m
    ]
    assert math.isclose(loss.item(), sum(per_token) / len(per_token), rel_tol=1e-5)
    assert metrics["pg_clipfrac"].item() == 0.0


@pytest.mark.parametrize("beta", [None, 0.0])
def test_dro_without_a_positive_beta_names_the_key(actor_config, beta):
    old, new, adv, mask = _inputs()
    with pytest.raises(ValueError, match=r"policy_loss\.dro_beta"):
        compute_policy_loss_dro(old, new, adv, mask, "token-mean", actor_config(dro_beta=beta))
