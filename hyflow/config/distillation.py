"""`distillation`: on-policy distillation from a teacher model, with verl's key names, and its load-time checks.

    python -m hyflow.trainer.main_ppo ... distillation.enabled=True \
        distillation.teacher_models.teacher_model.model_path=/models/teacher \
        distillation.distillation_loss.use_policy_gradient=True distillation.distillation_loss.loss_mode=k1

The student samples, the teacher scores every sampled token (`hyflow.workers.teacher`), and the per-token reverse
KL on the sampled token becomes the advantage (policy-gradient form), or a KL estimate (k3, k2, abs) becomes a loss
term of the actor update (direct form): `hyflow.algorithms.distillation`. What hyflow implements of verl's keys,
and what it refuses, is listed in docs/howto/distillation.md; `check_distillation` names each refusal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_KEY = "distillation"
_LOSS = "distillation.distillation_loss"
# verl's single-sample estimators on the sampled token: k1 (= kl) as the policy-gradient form's reward; those whose
# gradient depends on the teacher as the direct form's loss term (hyflow.algorithms.kl.kl_penalty computes them)
POLICY_GRADIENT_LOSS_MODES = ("k1", "kl")
DIRECT_LOSS_MODES = ("k3", "low_var_kl", "k2", "mse", "abs")


@dataclass
class DistillationLossConfig:
    """How the teacher's log-probs become a training signal (verl's `distillation.distillation_loss`)."""

    # the per-token estimator: k1 (= kl) in the policy-gradient form; k3 / low_var_kl, k2 / mse or abs in the direct
    # form (top-k modes are not implemented)
    loss_mode: str = "k3"
    topk: int | None = 32  # tokens of the top-k divergences (the *_topk loss modes, which hyflow does not implement)
    use_task_rewards: bool = True  # add the task-reward advantages to the distillation advantage
    distillation_loss_coef: float = 1.0  # weight of the distillation advantage (or of the direct form's loss term)
    loss_max_clamp: float | None = None  # upper bound on the per-token KL (advantage or loss term)
    log_prob_min_clamp: float | None = None  # lower bound on the student's and teacher's log-probs
    # True: the reverse KL as a per-token advantage (Thinking Machines 2025); False: the KL estimate as a loss term in
    # the actor update (GKD's direct form)
    use_policy_gradient: bool = False


@dataclass
class TeacherModelConfig:
    """One teacher (verl's `distillation.teacher_models.teacher_model`)."""

    model_path: str | None = None  # local Hugging Face folder of the teacher; it must share the student's tokenizer


@dataclass
class TeacherModelsConfig:
    """The teachers by name; hyflow distills from one, `teacher_model`."""

    teacher_model: TeacherModelConfig = field(default_factory=TeacherModelConfig)  # the one teacher


@dataclass
class DistillationConfig:
    """On-policy distillation: the student's sampled tokens scored by a teacher (verl's `distillation`)."""

    enabled: bool = False  # run the teacher and train on the per-token reverse KL to it
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)  # the signal
    teacher_models: TeacherModelsConfig = field(default_factory=TeacherModelsConfig)  # the teacher

    @property
    def teacher_path(self) -> str | None:
        """The one teacher's model folder."""
        return self.teacher_models.teacher_model.model_path


def check_distillation(config: Any) -> list[str]:
    """One message per `distillation` value hyflow cannot run (`config`: PPOTrainerConfig); none when disabled."""
    distillation = config.distillation
    if not distillation.enabled:
        return []
    loss = distillation.distillation_loss
    problems = []
    if distillation.teacher_path is None:
        problems.append(
            f"{_KEY}.enabled=True needs {_KEY}.teacher_models.teacher_model.model_path (the teacher's Hugging Face "
            "folder), but it is None. Fix: set it, or distillation.enabled=False."
        )
    problems += _loss_mode_problems(loss)
    if loss.loss_max_clamp is not None and loss.loss_max_clamp <= 0:
        problems.append(
            f"{_LOSS}.loss_max_clamp={loss.loss_max_clamp} must be > 0 (it caps the per-token KL from above). "
            "Fix: set a positive value such as 10.0, or null for no cap."
        )
    if loss.log_prob_min_clamp is not None and loss.log_prob_min_clamp >= 0:
        problems.append(
            f"{_LOSS}.log_prob_min_clamp={loss.log_prob_min_clamp} must be < 0 (it floors log-probabilities, which "
            "are <= 0). Fix: set a negative value such as -10.0, or null for no floor."
        )
    if loss.distillation_loss_coef < 0:
        problems.append(
            f"{_LOSS}.distillation_loss_coef={loss.distillation_loss_coef} must be >= 0 (a negative weight would "
            "push the student away from the teacher). Fix: set a value >= 0, e.g. 1.0."
        )
    return problems


def _loss_mode_problems(loss: DistillationLossConfig) -> list[str]:
    key = f"{_LOSS}.loss_mode"
    if loss.use_policy_gradient and loss.loss_mode not in POLICY_GRADIENT_LOSS_MODES:
        return [
            f"{key}={loss.loss_mode!r} with {_LOSS}.use_policy_gradient=True: hyflow's policy-gradient form uses "
            "the reverse KL on the sampled token (k1 = kl: log p_student - log p_teacher) as the reward; other "
            f"estimators and the top-k modes are not implemented there. Fix: set {key}=k1, or "
            f"{_LOSS}.use_policy_gradient=False with one of {list(DIRECT_LOSS_MODES)}."
        ]
    if not loss.use_policy_gradient and loss.loss_mode in POLICY_GRADIENT_LOSS_MODES:
        return [
            f"{key}={loss.loss_mode!r} with {_LOSS}.use_policy_gradient=False: the gradient of k1 backpropagated "
            "directly is that of log p_student alone and does not depend on the teacher, so it cannot distill. "
            f"Fix: set {_LOSS}.use_policy_gradient=True, or {key}=k3."
        ]
    if not loss.use_policy_gradient and loss.loss_mode not in DIRECT_LOSS_MODES:
        return [
            f"{key}={loss.loss_mode!r} is not implemented by hyflow: the direct form backpropagates a KL estimate "
            f"on the sampled token ({list(DIRECT_LOSS_MODES)}); the top-k modes (forward_kl_topk, reverse_kl_topk, "
            f"jsd_topk) would need the teacher's top-k distribution per token. Fix: set {key}=k3."
        ]
    return []
