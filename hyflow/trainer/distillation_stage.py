"""The trainer's on-policy distillation stage: the teacher's log-probs become the step's advantages.

    batch = batch.union(workers.teacher.compute_teacher_log_prob(batch))   # timing_s/teacher_log_prob
    batch = step_advantages(...)                                           # the task-reward advantages
    batch = distill_advantages(batch, config.distillation.distillation_loss, metrics)  # + -KL, or the loss term

The student's log-probs are `old_log_probs` (the old-log-prob pass runs whenever distillation is enabled,
`PPOTrainerConfig.old_log_prob_pass_reasons`), taken before the update, at the rollout's temperature as the
teacher's are. The math is `hyflow.algorithms.distillation`. Shape legend: B rows, R response length.
"""

from __future__ import annotations

from typing import Any

import torch

from hyflow import fields as F
from hyflow.algorithms.distillation import distillation_advantages, sampled_token_reverse_kl
from hyflow.algorithms.masked import masked_mean
from hyflow.config.distillation import DistillationLossConfig
from hyflow.protocol import DataProto

__all__ = ["distill_advantages"]


def distill_advantages(batch: DataProto, loss: DistillationLossConfig, metrics: dict[str, Any]) -> DataProto:
    """`batch` with `advantages` (B, R) replaced by the distillation advantages (plus the task advantages it holds
    when `loss.use_task_rewards`) in the policy-gradient form; in the direct form (`use_policy_gradient=False`)
    the task advantages (or zeros) stay and `meta_info["distillation_loss"]` tells the actor to add the KL term.
    `distillation/reverse_kl/{mean,max,min}` (the unclamped per-token log p_student − log p_teacher over
    response_mask 1) are added to `metrics`."""
    mask = batch.batch[F.RESPONSE_MASK]
    student, teacher = batch.batch[F.OLD_LOG_PROBS], batch.batch[F.TEACHER_LOG_PROBS]
    task = batch.batch[F.ADVANTAGES] if loss.use_task_rewards else torch.zeros_like(batch.batch[F.ADVANTAGES])
    if loss.use_policy_gradient:
        reverse_kl = sampled_token_reverse_kl(student, teacher, loss.log_prob_min_clamp)
        batch.batch[F.ADVANTAGES] = distillation_advantages(
            reverse_kl, mask, loss.distillation_loss_coef, loss.loss_max_clamp, task
        )
    else:  # the direct form: the actor's loss adds the KL term (hyflow.workers.actor)
        batch.batch[F.ADVANTAGES] = task
        batch.meta_info[F.DISTILLATION_LOSS] = loss
    raw = (student - teacher)[mask.bool()]
    if raw.numel() > 0:
        stats = torch.stack([masked_mean(student - teacher, mask), raw.max(), raw.min()]).tolist()  # one host sync
        names = ("distillation/reverse_kl/mean", "distillation/reverse_kl/max", "distillation/reverse_kl/min")
        metrics.update(dict(zip(names, stats)))
    return batch
