"""The controller's side of the off-policy corrections (`algorithm.rollout_correction`), on a generated batch.

Decoupled mode (after the old-log-prob pass): `apply_rollout_correction` writes the IS weights π_old/π_rollout
into `rollout_is_weights` (the actor's loss multiplies its per-token loss by them) and folds the rejection mask
into `response_mask` itself, so a rejected token leaves the loss, its normalisation, the advantages' token masks
and the entropy alike (as in verl). Bypass mode: `use_rollout_as_old` sets old_log_probs := rollout_log_probs and
sends the settings along for the `reinforce_is` loss, which weighs π_θ against them. The math is
`hyflow.algorithms.rollout_correction`.
"""

from __future__ import annotations

import torch

from hyflow import fields as F
from hyflow.algorithms.rollout_correction import (
    correction_metrics,
    parse_rejection_rules,
    rejection_mask,
    rollout_is_weights,
)
from hyflow.config import RolloutCorrectionConfig
from hyflow.protocol import DataProto

__all__ = ["apply_rollout_correction", "correct", "use_rollout_as_old"]


def _rollout_log_probs(batch: DataProto) -> torch.Tensor:
    if F.ROLLOUT_LOG_PROBS not in batch.batch.keys():  # noqa: SIM118 (TensorDict membership)
        raise ValueError(
            "algorithm.rollout_correction needs the engine's rollout_log_probs, but the generated batch has none "
            f"(it has {sorted(batch.batch.keys())}). Fix: set actor_rollout_ref.rollout.calculate_log_probs=True; "
            "a custom agent loop must return its tokens' log-probs."
        )
    return batch.batch[F.ROLLOUT_LOG_PROBS]


def apply_rollout_correction(batch: DataProto, correction: RolloutCorrectionConfig) -> dict[str, float]:
    """Decoupled mode: add `rollout_is_weights` (when `rollout_is`), mask rejected tokens out of `response_mask`
    (when `rollout_rs`), in place; returns the `rollout_corr/*` metrics of π_old against π_rollout."""
    old, rollout = batch.batch[F.OLD_LOG_PROBS], _rollout_log_probs(batch)
    mask = batch.batch[F.RESPONSE_MASK]
    weights, threshold = None, None
    if correction.rollout_is is not None:
        threshold = correction.rollout_is_threshold
        weights = rollout_is_weights(
            old, rollout, mask, correction.rollout_is, threshold, correction.rollout_is_batch_normalize
        )
        batch.batch[F.ROLLOUT_IS_WEIGHTS] = weights
    kept = None
    if correction.rollout_rs is not None:
        rules = parse_rejection_rules(correction.rollout_rs, correction.rollout_rs_threshold)
        kept = rejection_mask(old, rollout, mask, rules)
    metrics = correction_metrics(old, rollout, mask, weights, kept, threshold)
    if kept is not None:
        batch.batch[F.RESPONSE_MASK] = kept
    names, values = list(metrics), torch.stack(list(metrics.values())).tolist()  # one host sync
    return dict(zip(names, values))


def use_rollout_as_old(batch: DataProto, correction: RolloutCorrectionConfig) -> DataProto:
    """Bypass mode: old_log_probs := rollout_log_probs (no old-log-prob pass), and the settings in the batch's
    meta_info for the policy loss (`reinforce_is` reads them)."""
    batch.batch[F.OLD_LOG_PROBS] = _rollout_log_probs(batch).clone()
    batch.meta_info[F.ROLLOUT_CORRECTION] = correction
    return batch


def correct(batch: DataProto, correction: RolloutCorrectionConfig) -> tuple[DataProto, dict[str, float]]:
    """The trainer's stage after the old-log-prob pass: bypass mode, decoupled mode, or nothing when every
    correction is off; returns the batch and the metrics to log."""
    if correction.bypass_mode:
        return use_rollout_as_old(batch, correction), {}
    if correction.enabled:
        return batch, apply_rollout_correction(batch, correction)
    return batch, {}
