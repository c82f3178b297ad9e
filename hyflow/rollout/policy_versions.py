"""The policy versions that sampled a batch's tokens (`rollout_policy_versions`, partial rollouts): each row's
range, and metrics.

    non_tensors.update(version_range(versions))          # rollout_policy_version_min / _max per row
    metrics = policy_version_metrics(batch.batch[F.ROLLOUT_POLICY_VERSIONS], batch.batch[F.RESPONSE_MASK], 7)

Keys are by lag behind a reference version (the weights the engine holds now, or the trainer's), not by absolute
version, so a logger gets the same few series every step: `rollout/token_fraction_lag_{k}` for each lag k present,
plus `rollout/policy_version_min` / `_max` over the batch's tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from hyflow import fields as F


def version_range(versions: torch.Tensor) -> dict[str, np.ndarray]:
    """Per row of versions (B, R), the oldest and newest version among its tokens (entries >= 0; -1 marks padding,
    context tokens and untracked ones), -1 for a row with none: the non-tensor fields of that name."""
    tracked = versions >= 0
    oldest = torch.where(tracked, versions, torch.iinfo(versions.dtype).max).amin(dim=1)
    newest = versions.amax(dim=1)  # -1 where nothing is tracked
    oldest = torch.where(tracked.any(dim=1), oldest, -1)
    return {
        F.ROLLOUT_POLICY_VERSION_MIN: np.array(oldest.tolist(), dtype=object),
        F.ROLLOUT_POLICY_VERSION_MAX: np.array(newest.tolist(), dtype=object),
    }


def policy_version_metrics(versions: torch.Tensor, mask: torch.Tensor, current_version: int) -> dict[str, float]:
    """Fraction of the model tokens (mask 1) sampled k versions behind `current_version`, for every k present:

        token_fraction_lag_k = |{t : mask_t = 1, current_version - versions_t = k}| / |{t : mask_t = 1}|

    and the oldest / newest version among them; {} when the batch has no model token. versions, mask: (B, R).
    """
    valid = versions[mask.bool()]
    if valid.numel() == 0:
        return {}
    lags, counts = torch.unique(current_version - valid, return_counts=True)
    fractions = (counts.double() / valid.numel()).tolist()  # read on the host: once per batch, for logging
    metrics = {f"rollout/token_fraction_lag_{lag}": share for lag, share in zip(lags.tolist(), fractions)}
    metrics["rollout/policy_version_min"] = float(valid.min())
    metrics["rollout/policy_version_max"] = float(valid.max())
    return metrics
