"""The actor under routing replay: R2's old-log-prob pass records the trainer's own routing of every real token
(micro-batches trimmed as they are), and every forward of a batch that carries `routed_experts` (old log-probs,
reference, update) replays them, also where the trainer's routers would choose other experts."""

from __future__ import annotations

import pytest
import torch

from hyflow import fields as F
from hyflow.config.actor_rollout_ref import ActorConfig
from hyflow.models.loader import load_causal_lm
from hyflow.models.policy import PolicyModel
from hyflow.models.tiny import build_tiny_model
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.micro_batch_loop import ForwardSettings
from hyflow.workers.optim import build_optimizer

from .conftest import make_ppo_batch

ONE_ROW = ForwardSettings(micro_batch_size=1)  # each row its own micro-batch, trimmed to its own columns


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("moe")
    return str(build_tiny_model(folder, arch="qwen3_moe", hidden_size=32, num_layers=2, intermediate_size=64))


def _actor(path: str, remove_padding: bool) -> DataParallelPPOActor:
    config = ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1)
    torch.manual_seed(0)
    policy = PolicyModel(load_causal_lm(path), remove_padding=remove_padding)
    return DataParallelPPOActor(config, policy, build_optimizer(policy.parameters(), config.optim), mini_batch_size=4)


def _batch():
    """Prompts padded to 70 columns, so a short row's micro-batch is trimmed on both sides."""
    return make_ppo_batch(batch_size=4, prompt_length=70, response_length=5, seed=1)


def _whole_batch_forward(actor: DataParallelPPOActor, data, **kwargs):
    batch = data.batch
    with torch.no_grad():
        inputs = (batch[F.INPUT_IDS], batch[F.ATTENTION_MASK], batch[F.POSITION_IDS], batch[F.RESPONSES])
        return actor.module(*inputs, **kwargs)[0]


def _other_experts(routed: torch.Tensor) -> torch.Tensor:
    """Every recorded token's experts shifted by one (of 4): distinct, and none of them the trainer's choice."""
    return torch.where(routed == 255, routed, ((routed.long() + 1) % 4).to(routed.dtype))


@pytest.mark.parametrize("remove_padding", [False, True])
def test_r2s_pass_records_the_trainers_routing_of_every_real_token_across_trimmed_micro_batches(
    moe_path, remove_padding
):
    actor, data = _actor(moe_path, remove_padding), _batch()
    log_probs, _, routed = actor.compute_log_prob_and_routing(data, ONE_ROW)
    plain, _ = actor.compute_log_prob(data, ONE_ROW)
    torch.testing.assert_close(log_probs, plain, rtol=0, atol=0)
    _whole_batch_forward(actor, data, record_routing=True)  # one untrimmed forward of all rows
    assert torch.equal(routed, actor.module.routing_record)
    real = data.batch[F.ATTENTION_MASK].bool()
    assert (routed[real] != 255).all() and (routed[~real] == 255).all()


@pytest.mark.parametrize("remove_padding", [False, True])
def test_a_batch_with_routed_experts_is_scored_with_them_in_every_micro_batch(moe_path, remove_padding):
    actor, data = _actor(moe_path, remove_padding), _batch()
    _, _, routed = actor.compute_log_prob_and_routing(data, ONE_ROW)
    plain, _ = actor.compute_log_prob(data, ONE_ROW)
    data.batch[F.ROUTED_EXPERTS] = _other_experts(routed)
    replayed, _ = actor.compute_log_prob(data, ONE_ROW)
    expected = _whole_batch_forward(actor, data, routed_experts=data.batch[F.ROUTED_EXPERTS])
    torch.testing.assert_close(replayed, expected * data.batch[F.RESPONSE_MASK], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(replayed, plain)


def test_the_update_replays_the_routing_its_old_log_probs_were_computed_with(moe_path):
    """Old log-probs scored with other experts than the trainer's: the update's first ratio is 1 only if its own
    forward replays the same experts."""
    actor, data = _actor(moe_path, remove_padding=False), _batch()
    _, _, routed = actor.compute_log_prob_and_routing(data, ONE_ROW)
    data.batch[F.ROUTED_EXPERTS] = _other_experts(routed)
    data.batch[F.OLD_LOG_PROBS], _ = actor.compute_log_prob(data, ONE_ROW)
    metrics = actor.update_policy(data)
    assert abs(metrics["actor/ppo_kl"][0]) < 1e-6
    without = data.select(batch_keys=[k for k in data.batch.keys() if k != F.ROUTED_EXPERTS])  # noqa: SIM118
    assert abs(_actor(moe_path, remove_padding=False).update_policy(without)["actor/ppo_kl"][0]) > 1e-4
