"""`TeacherWorker`: the on-policy distillation teacher, a reference policy with another model path.

    group = LocalWorkerGroup(ClassWithInitArgs(TeacherWorker, config.actor_rollout_ref, teacher_path))
    group.init_model()                                  # loads the teacher; refuses one with another tokenizer
    out = group.compute_teacher_log_prob(batch)         # teacher_log_probs (B, R) of the student's sampled tokens

It is an `ActorRolloutRefWorker` holding only the ref role, built from `actor_rollout_ref` with `model.path`
replaced by the teacher's folder (no LoRA, the student's own tokenizer settings dropped), so it loads, shards,
offloads (`actor_rollout_ref.ref.fsdp_config`) and batches (`ref.log_prob_*`) exactly as the reference does, and
scores at the rollout's temperature. The teacher must tokenize as the student does: the teacher reads the
student's token ids, so `init_model` compares the two vocabularies and stops on any difference (distilling across
tokenizers is not supported).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hyflow import fields as F
from hyflow.config import ActorRolloutRefConfig
from hyflow.controller import Dispatch, register
from hyflow.models.loader import check_local_model_folder, load_tokenizer
from hyflow.protocol import DataProto
from hyflow.workers import builders
from hyflow.workers.actor_rollout_ref import ActorRolloutRefWorker

__all__ = ["TeacherWorker", "tokenizer_mismatch"]

_TEACHER_KEY = "distillation.teacher_models.teacher_model.model_path"


def tokenizer_mismatch(student: Any, teacher: Any, shown: int = 5) -> str | None:
    """Why `teacher`'s tokenizer does not map token ids as `student`'s does (sizes and up to `shown` tokens whose
    ids differ), or None when the two vocabularies are equal."""
    student_vocab, teacher_vocab = student.get_vocab(), teacher.get_vocab()
    if student_vocab == teacher_vocab:
        return None
    tokens = student_vocab.keys() | teacher_vocab.keys()
    differing = sorted(token for token in tokens if student_vocab.get(token) != teacher_vocab.get(token))
    examples = ", ".join(
        f"{token!r}: student {student_vocab.get(token)} / teacher {teacher_vocab.get(token)}"
        for token in differing[:shown]
    )
    return (
        f"the student's vocabulary has {len(student_vocab)} tokens, the teacher's {len(teacher_vocab)}; "
        f"{len(differing)} tokens have different ids (e.g. {examples})"
    )


class TeacherWorker(ActorRolloutRefWorker):
    """The teacher's log-probs of the student's sampled tokens; one process per device, beside the actor."""

    def __init__(self, config: ActorRolloutRefConfig, teacher_path: str) -> None:
        """`config`: the finalized `actor_rollout_ref` (the student's); `teacher_path`: the teacher's folder."""
        self.student_model = config.model
        teacher_model = dataclasses.replace(
            config.model, path=teacher_path, tokenizer_path=None, lora_rank=0, lora_adapter_path=None
        )
        super().__init__(dataclasses.replace(config, model=teacher_model), actor=False, rollout=False, ref=True)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the teacher as a reference model, after checking that it shares the student's tokenizer."""
        student_path = builders.model_path(self.student_model, "actor_rollout_ref.model")
        student = builders.tokenizer_for(self.student_model, student_path, "actor_rollout_ref.model")
        teacher_path = check_local_model_folder(self.config.model.path, _TEACHER_KEY)
        teacher = load_tokenizer(teacher_path, trust_remote_code=self.config.model.trust_remote_code, key=_TEACHER_KEY)
        problem = tokenizer_mismatch(student, teacher)
        if problem is not None:
            raise ValueError(
                f"{_TEACHER_KEY}={teacher_path!r} does not share the student's tokenizer ({student_path!r}): "
                f"{problem}. The teacher scores the student's token ids, so both must use one tokenizer; "
                "distillation across tokenizers is not supported. Fix: pick a teacher of the student's model family "
                "(same tokenizer files)."
            )
        super().init_model()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """`teacher_log_probs` (B, R) of the responses under the teacher, at the rollout's temperature."""
        settings = self._log_prob_settings(self.config.ref)
        log_probs, _ = self.ref.compute_log_prob(data, settings)
        return DataProto.from_dict({F.TEACHER_LOG_PROBS: log_probs}, meta_info={})
