"""The reverse-KL math of on-policy distillation, against per-token loops written out here."""

import math

import pytest
import torch

from hyflow.algorithms.distillation import (
    distillation_advantages,
    distillation_loss_per_token,
    sampled_token_reverse_kl,
)


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    student = -torch.rand(3, 5, generator=g) * 12
    teacher = -torch.rand(3, 5, generator=g) * 12
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 1, 1, 0]])  # 0s: padding, tool tokens
    task = torch.randn(3, 5, generator=g)
    return student, teacher, mask, task


def _naive_advantages(student, teacher, mask, coef, max_clamp, min_clamp, task):
    out = torch.zeros_like(student)
    for i in range(student.shape[0]):
        for t in range(student.shape[1]):
            if not mask[i, t]:
                continue
            log_s, log_t = student[i, t].item(), teacher[i, t].item()
            if min_clamp is not None:
                log_s, log_t = max(log_s, min_clamp), max(log_t, min_clamp)
            kl = log_s - log_t
            if max_clamp is not None:
                kl = min(kl, max_clamp)
            out[i, t] = -coef * kl + (task[i, t].item() if task is not None else 0.0)
    return out


@pytest.mark.parametrize("coef", [1.0, 0.5])
@pytest.mark.parametrize("max_clamp", [None, 2.0])
@pytest.mark.parametrize("min_clamp", [None, -6.0])
@pytest.mark.parametrize("with_task", [False, True])
def test_distillation_advantages_equal_the_per_token_loop(coef, max_clamp, min_clamp, with_task):
    student, teacher, mask, task = _batch()
    task = task if with_task else None
    kl = sampled_token_reverse_kl(student, teacher, min_clamp)
    got = distillation_advantages(kl, mask, coef, max_clamp, task)
    torch.testing.assert_close(got, _naive_advantages(student, teacher, mask, coef, max_clamp, min_clamp, task))


def test_the_advantage_is_minus_the_log_ratio_so_tokens_the_teacher_prefers_are_pushed_up():
    student = torch.log(torch.tensor([[0.5, 0.1]]))
    teacher = torch.log(torch.tensor([[0.1, 0.5]]))
    adv = distillation_advantages(sampled_token_reverse_kl(student, teacher), torch.ones(1, 2))
    assert adv[0, 0] == pytest.approx(-math.log(5)) and adv[0, 1] == pytest.approx(math.log(5))


def test_the_mean_k1_over_samples_of_the_student_estimates_the_reverse_kl():
    g = torch.Generator().manual_seed(0)
    p_student = torch.softmax(torch.randn(6, generator=g), -1)
    p_teacher = torch.softmax(torch.randn(6, generator=g) * 2, -1)
    samples = torch.multinomial(p_student, 200_000, replacement=True, generator=g)
    k1 = sampled_token_reverse_kl(p_student.log()[samples], p_teacher.log()[samples])
    exact = (p_student * (p_student.log() - p_teacher.log())).sum()
    assert k1.mean().item() == pytest.approx(exact.item(), abs=0.01)


def test_the_advantage_carries_no_gradient_to_the_log_probs():
    student = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = distillation_advantages(sampled_token_reverse_kl(student, torch.tensor([[-2.0, -1.0]])), torch.ones(1, 2))
    assert not adv.requires_grad


def _naive_loss(log_s: float, log_t: float, mode: str) -> float:
    x = log_s - log_t
    if mode in ("k2", "mse"):
        return 0.5 * x * x
    if mode == "abs":
        return abs(x)
    return math.exp(-x) + x - 1  # k3 / low_var_kl


@pytest.mark.parametrize("mode", ["k3", "low_var_kl", "k2", "mse", "abs"])
@pytest.mark.parametrize(("min_clamp", "max_clamp"), [(None, None), (-6.0, 3.0)])
def test_the_direct_forms_per_token_loss_equals_the_per_token_loop(mode, min_clamp, max_clamp):
    student, teacher, _, _ = _batch()
    student, teacher = student / 4, teacher / 4  # |x| < 3: away from kl_penalty's own k3 clamp at 10
    got = distillation_loss_per_token(student, teacher, mode, min_clamp, max_clamp)
    expected = torch.zeros_like(student)
    for i in range(student.shape[0]):
        for t in range(student.shape[1]):
            log_s, log_t = student[i, t].item(), teacher[i, t].item()
            if min_clamp is not None:
                log_s, log_t = max(log_s, min_clamp), max(log_t, min_clamp)
            value = _naive_loss(log_s, log_t, mode)
            expected[i, t] = value if max_clamp is None else min(value, max_clamp)
    torch.testing.assert_close(got, expected)


def test_the_direct_forms_gradient_depends_on_the_teacher_for_k3_and_not_for_k1():
    def gradient(mode: str, teacher: float) -> float:
        student = torch.tensor([[-1.0]], requires_grad=True)
        distillation_loss_per_token(student, torch.tensor([[teacher]]), mode).sum().backward()
        return student.grad.item()

    assert gradient("k3", -0.5) != pytest.approx(gradient("k3", -3.0))
    assert gradient("k1", -0.5) == gradient("k1", -3.0) == 1.0  # why k1 has no direct form
