"""TeacherWorker: the reference role loaded from the teacher's folder, refusing a teacher with another tokenizer."""

import pytest
import torch

from hyflow import fields as F
from hyflow.controller import ClassWithInitArgs, LocalWorkerGroup
from hyflow.controller.errors import WorkerError
from hyflow.models.tiny import build_tiny_model, build_tiny_tokenizer
from hyflow.workers.actor_rollout_ref import ActorRolloutRefWorker
from hyflow.workers.teacher import TeacherWorker, tokenizer_mismatch

from .test_actor_rollout_ref import actor_rollout_ref_config


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory) -> str:
    """Same tokenizer as `tiny_model_path`, other weights."""
    return build_tiny_model(tmp_path_factory.mktemp("teacher") / "t", hidden_size=32, num_layers=2, seed=7)


def _ref_log_probs(path: str, batch) -> torch.Tensor:
    """The log-probs of a reference worker loaded from `path`."""
    config = actor_rollout_ref_config(path)
    group = LocalWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, config, actor=False, rollout=False, ref=True))
    group.init_model()
    return group.compute_ref_log_prob(batch).batch[F.REF_LOG_PROB]


def test_the_teacher_scores_tokens_as_a_reference_at_its_path_would(tiny_model_path, teacher_path, ppo_batch):
    batch = ppo_batch(batch_size=4)
    config = actor_rollout_ref_config(tiny_model_path)  # the student's section
    teacher = LocalWorkerGroup(ClassWithInitArgs(TeacherWorker, config, teacher_path))
    teacher.init_model()

    scored = teacher.compute_teacher_log_prob(batch).batch[F.TEACHER_LOG_PROBS]
    torch.testing.assert_close(scored, _ref_log_probs(teacher_path, batch))
    assert not torch.allclose(scored, _ref_log_probs(tiny_model_path, batch))  # the teacher is not the student


def test_a_teacher_with_another_tokenizer_is_refused_at_load(tiny_model_path, tmp_path):
    other = build_tiny_model(tmp_path / "other", hidden_size=32, num_layers=2, tokenizer=build_tiny_tokenizer(400))
    group = LocalWorkerGroup(ClassWithInitArgs(TeacherWorker, actor_rollout_ref_config(tiny_model_path), other))

    with pytest.raises((ValueError, WorkerError)) as caught:
        group.init_model()
    message = str(caught.value)
    assert "distillation.teacher_models.teacher_model.model_path" in message
    assert "does not share the student's tokenizer" in message and "not supported" in message


def test_tokenizer_mismatch_names_the_sizes_and_differing_tokens_and_is_none_for_equal_vocabularies():
    student, same, other = build_tiny_tokenizer(), build_tiny_tokenizer(), build_tiny_tokenizer(400)
    assert tokenizer_mismatch(student, same) is None
    problem = tokenizer_mismatch(student, other)
    assert f"{len(student.get_vocab())} tokens, the teacher's {len(other.get_vocab())}" in problem
    assert "different ids" in problem
