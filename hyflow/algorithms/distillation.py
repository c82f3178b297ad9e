"""On-policy distillation: the per-token reverse KL to a teacher on the student's own samples, as an advantage.

The student π_s samples y ~ π_s(·|x); the teacher π_t scores every sampled token. The reverse KL
KL(π_s ‖ π_t) = E_{y_t ~ π_s}[log π_s(y_t|·) − log π_t(y_t|·)] has, on the sampled token, the one-sample (k1)
estimate k1_t = log π_s(y_t) − log π_t(y_t). Minimising the sequence's reverse KL with the policy gradient gives
each token the advantage −k1_t (Thinking Machines, "On-Policy Distillation", 2025; the on-policy student-sampled
setting of Agarwal et al., "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes"
(GKD), ICLR 2024, arXiv:2306.13649). Only model tokens (response_mask 1) count.

The other form backpropagates a per-token KL estimate directly, as a loss term (GKD's supervised form):
`distillation_loss_per_token` with k2 = (log π_s − log π_t)²/2 or k3 = r − log r − 1, r = π_t/π_s, whose gradients
depend on the teacher (k1's does not: its gradient is ∇log π_s alone, so k1 has no direct form).

Shape legend: B rows, R response length.
"""

from __future__ import annotations

import torch

from hyflow.algorithms.kl import kl_penalty

__all__ = ["distillation_advantages", "distillation_loss_per_token", "sampled_token_reverse_kl"]


def sampled_token_reverse_kl(
    student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, log_prob_min_clamp: float | None = None
) -> torch.Tensor:
    """(B, R) k1 estimate of the reverse KL on each sampled token:

        k1_t = max(log π_s(y_t), c) − max(log π_t(y_t), c)

    with c = `log_prob_min_clamp` (no floor when None): a floor keeps a token the teacher finds nearly impossible
    from dominating the batch (verl's `log_prob_min_clamp`). Its mean over sampled tokens estimates KL(π_s ‖ π_t)."""
    if log_prob_min_clamp is not None:
        student_log_probs = student_log_probs.clamp_min(log_prob_min_clamp)
        teacher_log_probs = teacher_log_probs.clamp_min(log_prob_min_clamp)
    return student_log_probs - teacher_log_probs


def distillation_advantages(
    reverse_kl: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float = 1.0,
    loss_max_clamp: float | None = None,
    task_advantages: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, R) advantages of the policy-gradient form of on-policy distillation:

        A_t = m_t · (A^task_t − coef · min(k1_t, loss_max_clamp))

    with m the response mask, k1 from `sampled_token_reverse_kl` (no cap when `loss_max_clamp` is None, verl's cap
    on the per-token loss) and A^task the task-reward advantages (0 when None: distillation alone). The token's
    advantage is detached from k1: the teacher's score is a reward, not a path for gradients."""
    kl = reverse_kl.detach()
    if loss_max_clamp is not None:
        kl = kl.clamp_max(loss_max_clamp)
    advantages = -coef * kl
    if task_advantages is not None:
        advantages = advantages + task_advantages
    return advantages * response_mask


def distillation_loss_per_token(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    loss_mode: str,
    log_prob_min_clamp: float | None = None,
    loss_max_clamp: float | None = None,
) -> torch.Tensor:
    """(B, R) per-token distillation loss of the direct form, differentiable in the student's log-probs:

        ℓ_t = min(KL_est(max(log π_s(y_t), c), max(log π_t(y_t), c)), loss_max_clamp)

    where KL_est is the estimator `loss_mode` of `hyflow.algorithms.kl.kl_penalty` (k2 / mse: x²/2, k3 /
    low_var_kl: e^{−x} + x − 1, abs: |x|, with x = log π_s − log π_t) and c = `log_prob_min_clamp`."""
    if log_prob_min_clamp is not None:
        student_log_probs = student_log_probs.clamp_min(log_prob_min_clamp)
        teacher_log_probs = teacher_log_probs.clamp_min(log_prob_min_clamp)
    loss = kl_penalty(student_log_probs, teacher_log_probs, loss_mode)
    if loss_max_clamp is not None:
        loss = loss.clamp_max(loss_max_clamp)
    return loss
