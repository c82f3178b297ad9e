"""Tests for hyflow.workers.micro_batch_loop: the no-grad forward and the update loop the actor and critic share."""

import copy
import logging
from types import SimpleNamespace

import pytest
import torch

from hyflow import fields as F
from hyflow.algorithms import agg_loss
from hyflow.models.packing import pack_rows
from hyflow.workers.batching import restore_order
from hyflow.workers.micro_batch_loop import ForwardSettings, forward_without_grad, run_ppo_epochs

VOCAB = 500


def make_config(micro_batch_size: int, ppo_epochs: int = 1) -> SimpleNamespace:
    return SimpleNamespace(
        ppo_micro_batch_size_per_gpu=micro_batch_size,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=None,
        grad_clip=1e6,
        ppo_epochs=ppo_epochs,
        shuffle=False,
    )


def token_loss(module: torch.nn.Module):
    """A micro-batch loss: the token-mean of a learned per-token score of the response, plus its token count."""

    def micro_batch_loss(micro, packed, agg_kwargs):
        scores = module(micro[F.RESPONSES]).squeeze(-1)
        mask = micro[F.RESPONSE_MASK].float()
        loss = agg_loss(scores, mask, "token-mean", **agg_kwargs)
        return loss, {"test/num_tokens": mask.sum()}

    return micro_batch_loss


def update(module: torch.nn.Module, batch, config: SimpleNamespace, mini_batch_size: int) -> dict[str, list[float]]:
    return run_ppo_epochs(
        module,
        torch.optim.SGD(module.parameters(), lr=0.1),
        batch,
        config,
        mini_batch_size=mini_batch_size,
        seed=0,
        device=torch.device("cpu"),
        metric_prefix="test",
        micro_batch_loss=token_loss(module),
    )


def test_run_ppo_epochs_reports_one_value_per_optimizer_step_with_summed_micro_batch_metrics(ppo_batch):
    batch = ppo_batch(batch_size=8).batch
    metrics = update(torch.nn.Embedding(VOCAB, 1), batch, make_config(micro_batch_size=2, ppo_epochs=3), 4)
    assert set(metrics) == {"test/num_tokens", "test/grad_norm", "test/num_skipped_steps", "test/lr"}
    assert len(metrics["test/grad_norm"]) == 3 * 2  # epochs × mini-batches
    mini_batch_tokens = [float(mini[F.RESPONSE_MASK].sum()) for mini in batch.split(4)]
    assert metrics["test/num_tokens"] == mini_batch_tokens * 3
    assert metrics["test/lr"] == pytest.approx([0.1] * 6)


def test_the_update_does_not_depend_on_the_micro_batch_size(ppo_batch):
    batch = ppo_batch(batch_size=8).batch
    torch.manual_seed(0)
    whole = torch.nn.Embedding(VOCAB, 1)
    in_pieces = copy.deepcopy(whole)
    update(whole, batch, make_config(micro_batch_size=8), 8)
    update(in_pieces, batch, make_config(micro_batch_size=3), 8)
    assert torch.allclose(whole.weight, in_pieces.weight, atol=1e-6)


def test_forward_without_grad_keeps_row_order_restores_train_mode_and_builds_no_graph(ppo_batch):
    batch = ppo_batch(batch_size=6).batch
    module = torch.nn.Embedding(VOCAB, 1).train()
    settings = ForwardSettings(micro_batch_size=4)

    def first_token_score(micro, packed):
        return module(micro[F.RESPONSES][:, 0])

    outputs, bins = forward_without_grad(module, batch, settings, torch.device("cpu"), first_token_score)
    assert module.training
    assert not any(output.requires_grad for output in outputs)
    assert torch.equal(restore_order(outputs, bins), module(batch[F.RESPONSES][:, 0]).detach())


def test_a_module_that_removes_padding_gets_each_micro_batch_packed_on_the_host(ppo_batch):
    batch = ppo_batch(batch_size=6).batch
    module = torch.nn.Embedding(VOCAB, 1)
    seen = []

    def record(micro, packed):
        seen.append((micro, packed))
        return module(micro[F.RESPONSES][:, 0])

    forward_without_grad(module, batch, ForwardSettings(micro_batch_size=4), torch.device("cpu"), record)
    assert [packed for _, packed in seen] == [None, None]  # a module that keeps padding gets no packing
    module.remove_padding = True
    seen.clear()
    forward_without_grad(module, batch, ForwardSettings(micro_batch_size=4), torch.device("cpu"), record)
    for micro, packed in seen:  # the micro-batch as trimmed, packed with its response tokens
        expected = pack_rows(micro[F.ATTENTION_MASK], micro[F.RESPONSES].shape[1])
        assert torch.equal(packed.indices, expected.indices) and torch.equal(packed.sources, expected.sources)


def test_a_step_skipped_for_a_non_finite_gradient_is_counted_and_warned_about_once(ppo_batch, caplog):
    batch = ppo_batch(batch_size=8).batch
    module = torch.nn.Embedding(VOCAB, 1)
    before = module.weight.detach().clone()
    loss_fn, calls = token_loss(module), []

    def nan_in_the_first_mini_batch(micro, packed, agg_kwargs):
        loss, metrics = loss_fn(micro, packed, agg_kwargs)
        calls.append(micro)
        return (loss * float("nan") if len(calls) <= 2 else loss), metrics  # 2 micro-batches per mini-batch

    with caplog.at_level(logging.WARNING, logger="hyflow.workers.micro_batch_loop"):
        metrics = run_ppo_epochs(
            module, torch.optim.SGD(module.parameters(), lr=0.1), batch, make_config(micro_batch_size=2),
            mini_batch_size=4, seed=0, device=torch.device("cpu"), metric_prefix="test",
            micro_batch_loss=nan_in_the_first_mini_batch,
        )  # fmt: skip
    assert metrics["test/num_skipped_steps"] == [1.0, 0.0]
    [warning] = [r.getMessage() for r in caplog.records]
    assert "1 of 2 optimizer step(s) skipped" in warning and "test/num_skipped_steps" in warning
    only_second = torch.nn.Embedding.from_pretrained(before.clone(), freeze=False)
    update(only_second, batch[4:], make_config(micro_batch_size=2), mini_batch_size=4)
    torch.testing.assert_close(module.weight, only_second.weight)  # as if the first step never happened
