"""DataParallelPPOActor in one process: log-probs against a naive softmax, and updates that ignore batch cutting."""

import copy
import math

import pytest
import torch

from hyflow import fields as F
from hyflow.algorithms import agg_loss
from hyflow.config.actor_rollout_ref import ActorConfig
from hyflow.models.loader import load_causal_lm
from hyflow.models.policy import PolicyModel
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.micro_batch_loop import ForwardSettings
from hyflow.workers.optim import build_optimizer


def build_actor(path: str, chunk_size: int = 7, remove_padding: bool = False, **overrides) -> DataParallelPPOActor:
    config = ActorConfig(ppo_mini_batch_size=4, **overrides)
    config.optim.lr = 1e-2
    torch.manual_seed(0)
    policy = PolicyModel(load_causal_lm(path), chunk_size=chunk_size, remove_padding=remove_padding)
    return DataParallelPPOActor(config, policy, build_optimizer(policy.parameters(), config.optim), mini_batch_size=4)


def naive_log_probs(lm, data, temperature):
    """The obvious computation: full logits, full fp32 log-softmax, gather."""
    batch = data.batch
    logits = lm(
        input_ids=batch[F.INPUT_IDS], attention_mask=batch[F.ATTENTION_MASK], position_ids=batch[F.POSITION_IDS]
    ).logits
    response_length = batch[F.RESPONSES].shape[1]
    logits = logits[:, -response_length - 1 : -1].float() / temperature
    log_softmax = torch.log_softmax(logits, dim=-1)
    log_probs = log_softmax.gather(-1, batch[F.RESPONSES].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_probs, entropy


@pytest.mark.parametrize("dynamic", [False, True])
def test_compute_log_prob_equals_a_naive_full_softmax(tiny_model_path, ppo_batch, dynamic):
    actor = build_actor(tiny_model_path)
    data = ppo_batch(batch_size=7, seed=1)
    settings = ForwardSettings(micro_batch_size=3, max_token_len=20 if dynamic else None, temperature=0.7)
    log_probs, entropys = actor.compute_log_prob(data, settings, calculate_entropy=True)
    with torch.no_grad():
        expected_log_probs, expected_entropy = naive_log_probs(actor.module.lm, data, 0.7)
    is_token = data.batch[F.ATTENTION_MASK][:, -5:].float()  # padding positions are 0
    torch.testing.assert_close(log_probs, expected_log_probs * is_token, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropys, expected_entropy * is_token, rtol=1e-5, atol=1e-5)


def test_log_prob_gradients_match_the_naive_computation(tiny_model_path, ppo_batch):
    actor = build_actor(tiny_model_path, chunk_size=4)
    data = ppo_batch(batch_size=3, seed=2)
    batch = data.batch
    args = [batch[k] for k in (F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS, F.RESPONSES)]
    log_probs, entropy = actor.module(*args, temperature=0.9, compute_entropy=True)
    (log_probs.sum() + entropy.sum()).backward()
    chunked_grads = [p.grad.clone() for p in actor.module.parameters()]
    actor.module.zero_grad()
    expected_log_probs, expected_entropy = naive_log_probs(actor.module.lm, data, 0.9)
    (expected_log_probs.sum() + expected_entropy.sum()).backward()
    for chunked, naive in zip(chunked_grads, [p.grad for p in actor.module.parameters()]):
        torch.testing.assert_close(chunked, naive, rtol=1e-4, atol=1e-6)


def run_update(actor: DataParallelPPOActor, data) -> dict:
    metrics = actor.update_policy(data)
    return metrics


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_size_and_dynamic_bsz_do_not_change_the_update(tiny_model_path, ppo_batch, loss_agg_mode):
    data = ppo_batch(batch_size=8, seed=3)
    settings = [
        {"ppo_micro_batch_size_per_gpu": 4},
        {"ppo_micro_batch_size_per_gpu": 1},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 25},
    ]
    results = []
    for setting in settings:
        actor = build_actor(
            tiny_model_path, loss_agg_mode=loss_agg_mode, use_kl_loss=True, entropy_coeff=0.01, **setting
        )
        metrics = run_update(actor, copy.deepcopy(data))
        results.append((metrics, [p.detach().clone() for p in actor.module.parameters()]))
    reference_metrics, reference_params = results[0]
    assert len(reference_metrics["actor/pg_loss"]) == 2  # two mini-batches of 4 rows
    for metrics, params in results[1:]:
        for name in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl"):
            assert metrics[name] == pytest.approx(reference_metrics[name], rel=1e-4, abs=1e-6), name
        for p, q in zip(params, reference_params):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4)  # lr 1e-2: float noise, far below one step


def test_update_changes_parameters_and_reports_metrics(tiny_model_path, ppo_batch):
    actor = build_actor(tiny_model_path, ppo_epochs=2, shuffle=True)
    before = [p.detach().clone() for p in actor.module.parameters()]
    metrics = run_update(actor, ppo_batch(batch_size=8, seed=4))
    assert len(metrics["actor/pg_loss"]) == 4  # 2 epochs × 2 mini-batches
    assert all(math.isfinite(v) for v in metrics["actor/grad_norm"])
    assert metrics["actor/lr"] == [pytest.approx(1e-2)] * 4
    assert metrics["actor/num_skipped_steps"] == [0.0] * 4
    assert any(not torch.equal(p, q) for p, q in zip(before, actor.module.parameters()))


def test_non_finite_gradient_skips_the_step_and_is_counted(tiny_model_path, ppo_batch):
    actor = build_actor(tiny_model_path)
    data = ppo_batch(batch_size=4, seed=5)
    data.batch[F.ADVANTAGES][0, 0] = float("nan")
    data.batch[F.RESPONSE_MASK][0, 0] = 1
    before = [p.detach().clone() for p in actor.module.parameters()]
    metrics = run_update(actor, data)
    assert metrics["actor/num_skipped_steps"] == [1.0]
    assert all(torch.equal(p, q) for p, q in zip(before, actor.module.parameters()))


def test_mini_batch_size_that_does_not_divide_the_batch_is_an_error(tiny_model_path, ppo_batch):
    actor = build_actor(tiny_model_path)
    with pytest.raises(ValueError, match="ppo_mini_batch_size"):
        actor.update_policy(ppo_batch(batch_size=6, seed=6))


def test_gradient_checkpointing_does_not_change_the_update(tiny_model_path, ppo_batch):
    from hyflow.workers.builders import enable_gradient_checkpointing

    data = ppo_batch(batch_size=4, seed=7)
    results = []
    for checkpointing in (False, True):
        actor = build_actor(tiny_model_path)
        if checkpointing:
            enable_gradient_checkpointing(actor.module.lm)
        metrics = run_update(actor, copy.deepcopy(data))
        results.append((metrics["actor/grad_norm"], [p.detach().clone() for p in actor.module.parameters()]))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    for p, q in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_custom_policy_loss_receives_the_batch_fields_named_in_extra_batch_keys(tiny_model_path, ppo_batch):
    from hyflow.algorithms import compute_policy_loss_vanilla, register_policy_loss

    received = []

    @register_policy_loss("test_reward_weighted")
    def reward_weighted(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **kwargs):
        received.append(kwargs[F.TOKEN_LEVEL_REWARDS])
        return compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)

    data = ppo_batch(batch_size=4, seed=5)
    data.batch[F.TOKEN_LEVEL_REWARDS] = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    actor = build_actor(tiny_model_path)
    actor.config.policy_loss.loss_mode = "test_reward_weighted"
    actor.config.policy_loss.extra_batch_keys = [F.TOKEN_LEVEL_REWARDS]
    actor.policy_loss_fn = reward_weighted
    run_update(actor, data)
    assert torch.equal(torch.cat(received).sort(dim=0).values, data.batch[F.TOKEN_LEVEL_REWARDS].sort(dim=0).values)


def test_an_extra_batch_key_the_batch_does_not_carry_is_a_clear_error(tiny_model_path, ppo_batch):
    actor = build_actor(tiny_model_path)
    actor.config.policy_loss.extra_batch_keys = ["token_level_rewrds"]
    with pytest.raises(ValueError, match="extra_batch_keys names 'token_level_rewrds'"):
        run_update(actor, ppo_batch(batch_size=4, seed=5))


def test_removing_padding_gives_the_same_log_probs_and_update(tiny_model_path, ppo_batch):
    data = ppo_batch(batch_size=8, seed=5)
    settings = ForwardSettings(micro_batch_size=3)
    results = []
    for remove_padding in (False, True):
        actor = build_actor(tiny_model_path, remove_padding=remove_padding, entropy_coeff=0.01, use_kl_loss=True)
        log_probs, entropys = actor.compute_log_prob(copy.deepcopy(data), settings, calculate_entropy=True)
        metrics = actor.update_policy(copy.deepcopy(data))
        results.append((log_probs, entropys, metrics, [p.detach().clone() for p in actor.module.parameters()]))
    (padded_lp, padded_ent, padded_metrics, padded_params), (lp, ent, metrics, params) = results
    torch.testing.assert_close(lp, padded_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, padded_ent, rtol=1e-5, atol=1e-5)
    for name in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
        assert metrics[name] == pytest.approx(padded_metrics[name], rel=1e-4, abs=1e-6), name
    for param, expected in zip(params, padded_params):
        torch.testing.assert_close(param, expected, rtol=1e-4, atol=1e-4)  # Adam at lr 1e-2 amplifies fp32 noise


def test_update_without_old_log_probs_equals_the_update_after_recomputing_them(tiny_model_path, ppo_batch):
    data = ppo_batch(batch_size=4, seed=8)  # one mini-batch of 4 rows: one optimizer step
    recomputed = build_actor(tiny_model_path, ppo_micro_batch_size_per_gpu=2)
    with_old = copy.deepcopy(data)
    settings = ForwardSettings(temperature=0.8)
    old_log_probs, entropys = recomputed.compute_log_prob(with_old, settings, calculate_entropy=True)
    with_old.batch[F.OLD_LOG_PROBS] = old_log_probs
    recomputed_metrics = recomputed.update_policy(with_old, temperature=0.8)

    skipped = build_actor(tiny_model_path, ppo_micro_batch_size_per_gpu=2)
    without_old = copy.deepcopy(data)
    without_old.pop(batch_keys=[F.OLD_LOG_PROBS])
    skipped_metrics = skipped.update_policy(without_old, temperature=0.8)

    for name in ("actor/pg_loss", "actor/grad_norm"):
        assert skipped_metrics[name] == pytest.approx(recomputed_metrics[name], rel=1e-5, abs=1e-7), name
    assert skipped_metrics["actor/ppo_kl"] == [0.0] and skipped_metrics["actor/pg_clipfrac"] == [0.0]  # ratio 1
    expected_entropy = agg_loss(entropys, data.batch[F.RESPONSE_MASK], "token-mean").item()
    assert skipped_metrics["actor/entropy"] == [pytest.approx(expected_entropy, rel=1e-5)]
    assert "actor/entropy" not in recomputed_metrics  # entropy_coeff=0: only the skipped pass's stand-in reports it
    for p, q in zip(skipped.module.parameters(), recomputed.module.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4)  # Adam's first step is ±lr=1e-2: noise is far below


@pytest.mark.parametrize(("overrides", "batch_size"), [({"ppo_epochs": 2}, 4), ({}, 8)])
def test_update_without_old_log_probs_over_several_optimizer_steps_is_an_error(
    tiny_model_path, ppo_batch, overrides, batch_size
):
    actor = build_actor(tiny_model_path, **overrides)
    data = ppo_batch(batch_size=batch_size, seed=9)
    data.pop(batch_keys=[F.OLD_LOG_PROBS])
    before = [p.detach().clone() for p in actor.module.parameters()]
    with pytest.raises(ValueError, match=r"got no 'old_log_probs'.*Fix: compute old_log_probs first"):
        actor.update_policy(data)
    assert all(torch.equal(p, q) for p, q in zip(before, actor.module.parameters()))
