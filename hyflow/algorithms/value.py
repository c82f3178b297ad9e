"""The critic's loss: clipped value regression (PPO, Schulman et al. 2017, arXiv:1707.06347).

Shapes: `vpreds`, `returns`, `values`, `response_mask` are (B, T).
"""

from __future__ import annotations

import torch

from hyflow.algorithms.aggregation import Count, agg_loss
from hyflow.algorithms.masked import masked_mean

__all__ = ["compute_value_loss"]


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: Count | None = None,
    global_batch_size: Count | None = None,
    loss_scale_factor: Count | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss; returns `(vf_loss, vf_clipfrac)`.

        V_clip = clip(V_new, V_old − c, V_old + c)
        L_t = ½ · max((V_new − R)², (V_clip − R)²),  aggregated with `agg_loss`

    `values` are V_old (the values computed before the update), `returns` the GAE targets, `c` =
    `cliprange_value`. `vf_clipfrac` is the fraction of tokens where the clipped term is the larger. The global
    counts (`dp_size`, `batch_num_tokens`, `global_batch_size`, `loss_scale_factor`, in verl 0.9's order) go to
    `agg_loss`, so micro-batch losses add up to the mini-batch's.
    """
    vpreds_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped = (vpreds - returns) ** 2
    clipped = (vpreds_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(
        torch.maximum(unclipped, clipped),
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = masked_mean((clipped > unclipped).float(), response_mask).detach()
    return vf_loss, vf_clipfrac
