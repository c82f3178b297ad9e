"""Loss aggregation: reduce a per-token loss matrix (B, T) to the scalar that is back-propagated.

The normaliser decides how tokens and sequences are weighted. Pass the count of the whole mini-batch
(`batch_num_tokens` for token-mean, `global_batch_size` for the seq-mean modes) and the results of its
micro-batches *add up* to the mini-batch loss, whatever the micro-batch size or the number of ranks; the
training engine relies on that to make an update independent of how a batch was cut. Without those counts the
loss is normalised by the micro-batch's own counts (verl's behaviour), which is exact only for a single
micro-batch.
"""

from __future__ import annotations

import torch

__all__ = ["LOSS_AGG_MODES", "agg_loss"]

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

Count = int | float | torch.Tensor


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: Count | None = None,
    global_batch_size: Count | None = None,
    loss_scale_factor: Count | None = None,
) -> torch.Tensor:
    """Aggregate `loss_mat` (B, T) over the tokens where `loss_mask` (B, T) is 1.

    With l_it the loss of token t of sequence i, m_it the mask, n_i = Σ_t m_it, S = {i : n_i > 0}:

    - ``token-mean``:             Σ_it m_it·l_it / N,  N = `batch_num_tokens` or Σ_it m_it (every token weighs the
      same; the PPO and DAPO default).
    - ``token-sum``:              Σ_it m_it·l_it  (no normaliser: the loss grows with the number of tokens).
    - ``seq-mean-token-sum``:     Σ_{i∈S} (Σ_t m_it·l_it) / G,  G = `global_batch_size` or |S|.
    - ``seq-mean-token-mean``:    Σ_{i∈S} (Σ_t m_it·l_it / n_i) / G  (every sequence weighs the same; GRPO paper).
    - ``seq-mean-token-sum-norm``: Σ_{i∈S} (Σ_t m_it·l_it / L) / G,  L = `loss_scale_factor` or T, a constant
      instead of each sequence's own length, so long and short answers are not re-weighted
      (Dr.GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783). Pass
      `loss_scale_factor` (e.g. the max response length) when micro-batches are padded to different T.
      (Some verl versions omit the 1/G here; that only rescales the loss, i.e. the learning rate, by G.)

    The result is multiplied by `dp_size`, which cancels the 1/dp_size of data-parallel gradient averaging when
    the global counts cover all ranks (for token-sum: the ranks' gradients add up to the gradient of the global
    sum). Denominators of zero (no valid token) give a loss of 0, not NaN. The keywords and their order are
    verl 0.9's.

    Raises:
        ValueError: `loss_agg_mode` is not one of LOSS_AGG_MODES, or `dp_size` > 1 without the global count the
            mode divides by (each rank would normalise by its own count).
    """
    if loss_agg_mode == "token-sum":
        return (loss_mat * loss_mask).sum() * dp_size
    if loss_agg_mode == "token-mean":
        _require_global_count(batch_num_tokens, "batch_num_tokens", loss_agg_mode, dp_size)
        denominator = loss_mask.sum() if batch_num_tokens is None else batch_num_tokens
        total = (loss_mat * loss_mask).sum()
    elif loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        seq_token_counts = loss_mask.sum(dim=-1)
        seq_losses = (loss_mat * loss_mask).sum(dim=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_losses = seq_losses / seq_token_counts.clamp_min(1e-8)
        elif loss_agg_mode == "seq-mean-token-sum-norm":
            seq_losses = seq_losses / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        total = seq_losses.sum()  # sequences without valid tokens contribute 0
        _require_global_count(global_batch_size, "global_batch_size", loss_agg_mode, dp_size)
        denominator = (seq_token_counts > 0).sum() if global_batch_size is None else global_batch_size
    else:
        raise ValueError(
            f"loss_agg_mode={loss_agg_mode!r} is not supported. Allowed values: {list(LOSS_AGG_MODES)} "
            f"(set actor_rollout_ref.actor.loss_agg_mode / critic.loss_agg_mode to one of them)."
        )
    denominator = torch.as_tensor(denominator, dtype=total.dtype, device=total.device)
    return total / denominator.clamp_min(1e-8) * dp_size


def _require_global_count(count: Count | None, name: str, loss_agg_mode: str, dp_size: int) -> None:
    if count is None and dp_size > 1:
        raise ValueError(
            f"agg_loss(loss_agg_mode={loss_agg_mode!r}, dp_size={dp_size}) needs {name}, the count over all "
            f"ranks; without it every rank would normalise by its own count. Pass {name}=... (or dp_size=1)."
        )
