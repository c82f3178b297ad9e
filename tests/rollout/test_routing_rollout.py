"""Routing replay R3 in the rollout: the engine's routing record reaches the batch as `routed_experts`, aligned with
input_ids, and equals the routing of the training forward over the returned layout (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from hyflow import fields as F
from hyflow.config.actor_rollout_ref import RolloutConfig
from hyflow.models.policy import PolicyModel
from hyflow.rollout.batch import routing_rows
from hyflow.rollout.worker_rollout import build_rollout

from ..engine.engine_testkit import make_tiny_hf_model
from .rollout_testkit import prompt_batch

PROMPTS = [[5, 9, 13, 17, 21, 3], [11, 4, 8], [30, 31, 32, 33]]


def _config(**overrides) -> RolloutConfig:
    settings = dict(prompt_length=8, response_length=6, max_num_seqs=8, max_num_batched_tokens=64, temperature=1.0)
    settings.update(overrides)
    return RolloutConfig(**settings)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_the_rollouts_routed_experts_are_the_routing_of_the_training_forward_over_its_layout(family):
    hf = make_tiny_hf_model(family)
    rollout = build_rollout(_config(), hf, tokenizer=None, record_routing=True)
    batch = rollout.generate_sequences(prompt_batch(PROMPTS, seed=5)).batch
    routed = batch[F.ROUTED_EXPERTS]
    assert routed.shape == (3, 12, 2, 2) and routed.dtype == torch.uint8
    policy = PolicyModel(hf)
    with torch.no_grad():
        inputs = (batch[F.INPUT_IDS], batch[F.ATTENTION_MASK], batch[F.POSITION_IDS], batch[F.RESPONSES])
        policy(*inputs, record_routing=True)
    recorded = (routed != 255).all(-1).all(-1)
    real = batch[F.ATTENTION_MASK].bool()
    last = real.long().cumsum(1).argmax(1)  # each row's last real token: never fed through the engine
    assert recorded.sum() == real.sum() - 3 and not recorded[torch.arange(3), last].any()
    assert torch.equal(routed[recorded], policy.routing_record[recorded])


def test_without_routing_replay_the_rollout_carries_no_routing():
    rollout = build_rollout(_config(), make_tiny_hf_model("mixtral"), tokenizer=None)
    assert F.ROUTED_EXPERTS not in rollout.generate_sequences(prompt_batch(PROMPTS, seed=5)).batch.keys()  # noqa: SIM118


def test_r3_on_an_architecture_the_engine_lacks_is_a_clear_error():
    hf = make_tiny_hf_model("mixtral")
    hf.config.architectures, hf.config.model_type = ["MyMoeForCausalLM"], "custom"
    with pytest.raises(ValueError, match=r"router_replay\.mode=R3 replays the routing the engine records"):
        build_rollout(_config(), hf, tokenizer=None, record_routing=True)


def test_routing_rows_place_each_record_from_its_first_prompt_token_and_cut_it_at_the_width():
    records = [torch.full((4, 1, 2), 7, dtype=torch.uint8), None, torch.full((9, 1, 2), 3, dtype=torch.uint8)]
    rows = routing_rows(records, prompt_lengths=[2, 3, 4], prompt_length=4, total_length=8)
    assert rows[0, :, 0, 0].tolist() == [255, 255, 7, 7, 7, 7, 255, 255]
    assert (rows[1] == 255).all()
    assert rows[2, :, 0, 0].tolist() == [3] * 8


def test_routed_experts_travel_with_their_rows_through_chunk_and_concat():
    from hyflow.protocol import DataProto

    rollout = build_rollout(_config(), make_tiny_hf_model("mixtral"), tokenizer=None, record_routing=True)
    out = rollout.generate_sequences(prompt_batch(PROMPTS, seed=5))
    parts = out.chunk(3)
    assert torch.equal(parts[1].batch[F.ROUTED_EXPERTS], out.batch[F.ROUTED_EXPERTS][1:2])
    assert torch.equal(DataProto.concat(parts).batch[F.ROUTED_EXPERTS], out.batch[F.ROUTED_EXPERTS])
