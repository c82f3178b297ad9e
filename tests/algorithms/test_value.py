import math

import torch

from hyflow.algorithms import compute_value_loss


def test_value_loss_matches_a_per_token_loop_with_clipping():
    torch.manual_seed(0)
    vpreds, returns, values = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.3)
    losses, clipped = [], []
    for vp, r, v, m in zip(*(t.flatten().tolist() for t in (vpreds, returns, values, mask))):
        if m:
            vp_clip = min(max(vp, v - 0.3), v + 0.3)
            losses.append(0.5 * max((vp - r) ** 2, (vp_clip - r) ** 2))
            clipped.append((vp_clip - r) ** 2 > (vp - r) ** 2)
    assert math.isclose(loss.item(), sum(losses) / len(losses), rel_tol=1e-5)
    assert math.isclose(clipfrac.item(), sum(clipped) / len(clipped), rel_tol=1e-5)


def test_value_loss_forwards_global_counts_so_micro_batches_add_up():
    torch.manual_seed(1)
    vpreds, returns, values = torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 3)
    mask = (torch.rand(4, 3) > 0.3).float()
    full, _ = compute_value_loss(vpreds, returns, values, mask, 0.2)
    parts = [
        compute_value_loss(
            vpreds[i : i + 1], returns[i : i + 1], values[i : i + 1], mask[i : i + 1], 0.2, batch_num_tokens=mask.sum()
        )[0]
        for i in range(4)
    ]
    assert torch.allclose(sum(parts), full, atol=1e-6)


def test_value_loss_takes_verls_keywords_in_verls_order():
    torch.manual_seed(2)
    vpreds, returns, values = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)
    mask = torch.ones(2, 3)
    positional, _ = compute_value_loss(vpreds, returns, values, mask, 0.2, "token-mean", 2, torch.tensor(12.0))
    by_name, _ = compute_value_loss(vpreds, returns, values, mask, 0.2, dp_size=2, batch_num_tokens=torch.tensor(12.0))
    alone, _ = compute_value_loss(vpreds, returns, values, mask, 0.2)
    assert torch.equal(positional, by_name) and torch.allclose(positional, alone)  # 2 ranks x 6/12 of the tokens
