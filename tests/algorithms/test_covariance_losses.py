import torch

from hyflow.algorithms import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov


def _inputs(seed=0, batch=8, length=16):
    generator = torch.Generator().manual_seed(seed)
    old = torch.randn(batch, length, generator=generator) - 1.0
    new = old + 0.05 * torch.randn(batch, length, generator=generator)
    adv = 3 * torch.randn(batch, length, generator=generator)
    mask = (torch.rand(batch, length, generator=generator) > 0.2).float()
    return old, new, adv, mask


def naive_covariances(adv, log_prob, mask):
    valid = [(i, a, lp) for i, (a, lp, m) in enumerate(zip(adv, log_prob, mask)) if m]
    mean_a = sum(a for _, a, _ in valid) / len(valid)
    mean_lp = sum(lp for _, _, lp in valid) / len(valid)
    return {i: (a - mean_a) * (lp - mean_lp) for i, a, lp in valid}


def test_kl_cov_penalises_exactly_the_top_covariance_tokens(actor_config):
    old, new, adv, mask = _inputs()
    config = actor_config(kl_cov_ratio=0.05, ppo_kl_coef=0.5)
    loss, metrics = compute_policy_loss_kl_cov(old, new, adv, mask, "token-mean", config)
    flat = [t.flatten().tolist() for t in (old, new, adv, mask)]
    covariances = naive_covariances(flat[2], flat[1], flat[3])
    k = max(1, int(len(covariances) * 0.05))
    top = set(sorted(covariances, key=covariances.get, reverse=True)[:k])
    total = 0.0
    for i in covariances:
        log_ratio = flat[1][i] - flat[0][i]
        total += -flat[2][i] * torch.tensor(log_ratio).exp().item() + (0.5 * abs(log_ratio) if i in top else 0.0)
    assert abs(loss.item() - total / len(covariances)) < 1e-5
    assert metrics["pg_clipfrac"].item() == 0.0


def test_clip_cov_detaches_the_chosen_number_of_tokens_within_the_covariance_bounds(actor_config):
    torch.manual_seed(0)
    old, new, adv, mask = _inputs(seed=1)
    new.requires_grad_(True)
    config = actor_config(clip_cov_ratio=0.05, clip_cov_lb=0.0, clip_cov_ub=100.0)
    loss, metrics = compute_policy_loss_clip_cov(old, new, adv, mask, "token-mean", config)
    (grad,) = torch.autograd.grad(loss, new)
    num_valid = int(mask.sum())
    detached = ((grad == 0) & (mask > 0)).flatten().nonzero().squeeze(-1).tolist()
    assert len(detached) == max(1, int(0.05 * num_valid))
    assert abs(metrics["pg_clipfrac"].item() - len(detached) / num_valid) < 1e-6
    covariances = naive_covariances(adv.flatten().tolist(), new.detach().flatten().tolist(), mask.flatten().tolist())
    assert all(0.0 < covariances[i] < 100.0 for i in detached)


def test_clip_cov_equals_ppo_clip_when_no_token_is_in_the_covariance_window(actor_config):
    from hyflow.algorithms import compute_policy_loss_vanilla

    old, new, adv, mask = _inputs(seed=2)
    config = actor_config(clip_cov_lb=1e6, clip_cov_ub=1e7, clip_ratio_c=1e9)
    loss, _ = compute_policy_loss_clip_cov(old, new, adv, mask, "token-mean", config)
    reference, _ = compute_policy_loss_vanilla(old, new, adv, mask, "token-mean", config)
    assert torch.allclose(loss, reference, atol=1e-6)
