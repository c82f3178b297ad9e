import math

import pytest
import torch

from hyflow.algorithms import LOSS_AGG_MODES, agg_loss


def naive_agg_loss(loss_mat, loss_mask, mode, scale=None):
    rows = []
    for losses, mask in zip(loss_mat.tolist(), loss_mask.tolist()):
        valid = [loss for loss, m in zip(losses, mask) if m]
        if valid:
            rows.append(valid)
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if mode == "token-sum":
        return sum(sum(r) for r in rows)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-sum-norm":
        scale = loss_mat.shape[-1] if scale is None else scale
        return sum(sum(r) / scale for r in rows) / len(rows)
    raise AssertionError(mode)


def _batch(seed=0, batch=6, length=7):
    generator = torch.Generator().manual_seed(seed)
    loss_mat = torch.randn(batch, length, generator=generator)
    lengths = torch.randint(1, length + 1, (batch,), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    mask[2] = 0.0  # one sequence without a valid token
    return loss_mat, mask


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_matches_a_loop_over_valid_tokens(mode):
    loss_mat, mask = _batch()
    assert math.isclose(agg_loss(loss_mat, mask, mode).item(), naive_agg_loss(loss_mat, mask, mode), rel_tol=1e-5)


def test_seq_mean_token_sum_norm_divides_by_the_given_constant_like_dr_grpo():
    loss_mat, mask = _batch(seed=3)
    value = agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=100)
    assert math.isclose(
        value.item(), naive_agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", scale=100), rel_tol=1e-5
    )
    default = agg_loss(loss_mat, mask, "seq-mean-token-sum-norm")
    assert math.isclose(default.item(), value.item() * 100 / loss_mat.shape[-1], rel_tol=1e-5)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("micro_batch_size", [1, 2, 4])
def test_summing_micro_batches_with_global_counts_equals_the_full_batch_loss(mode, micro_batch_size):
    loss_mat, mask = _batch(seed=1, batch=8)
    full = agg_loss(loss_mat, mask, mode)
    batch_num_tokens = mask.sum()
    global_batch_size = (mask.sum(-1) > 0).sum()
    pieces = [
        agg_loss(
            loss_mat[i : i + micro_batch_size],
            mask[i : i + micro_batch_size],
            mode,
            batch_num_tokens=batch_num_tokens,
            global_batch_size=global_batch_size,
        )
        for i in range(0, len(loss_mat), micro_batch_size)
    ]
    assert torch.allclose(sum(pieces), full, rtol=1e-5, atol=1e-6)


def test_dp_size_scales_the_loss_to_cancel_gradient_averaging():
    loss_mat, mask = _batch(seed=4)
    single = agg_loss(loss_mat, mask, "token-mean", batch_num_tokens=mask.sum())
    assert torch.allclose(agg_loss(loss_mat, mask, "token-mean", batch_num_tokens=mask.sum(), dp_size=4), 4 * single)


def test_a_micro_batch_without_valid_tokens_gives_zero_not_nan():
    loss_mat, mask = torch.randn(2, 3), torch.zeros(2, 3)
    for mode in LOSS_AGG_MODES:
        assert agg_loss(loss_mat, mask, mode).item() == 0.0


def test_unknown_aggregation_mode_raises_with_the_allowed_values():
    with pytest.raises(ValueError, match=r"loss_agg_mode='token-max'.*'token-mean'.*'seq-mean-token-sum-norm'"):
        agg_loss(torch.zeros(1, 2), torch.ones(1, 2), "token-max")


def test_token_sum_scaled_by_dp_size_adds_up_to_the_global_sum_after_gradient_averaging():
    loss_mat, mask = _batch(seed=5, batch=8)
    ranks = [agg_loss(loss_mat[i : i + 2], mask[i : i + 2], "token-sum", dp_size=4) for i in range(0, 8, 2)]
    assert torch.allclose(sum(ranks) / 4, (loss_mat * mask).sum())


@pytest.mark.parametrize(
    ("mode", "count"), [("token-mean", "batch_num_tokens"), ("seq-mean-token-mean", "global_batch_size")]
)
def test_dp_size_above_one_without_the_global_count_is_refused(mode, count):
    loss_mat, mask = _batch()
    with pytest.raises(ValueError, match=f"needs {count}"):
        agg_loss(loss_mat, mask, mode, dp_size=2)


def test_the_keywords_follow_verls_order_after_the_mode():
    loss_mat, mask = _batch()
    positional = agg_loss(loss_mat, mask, "token-mean", 2, mask.sum())
    assert torch.allclose(positional, agg_loss(loss_mat, mask, "token-mean", dp_size=2, batch_num_tokens=mask.sum()))
