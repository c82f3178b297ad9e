"""Routing replay in the training forward (models/router_replay.py): given expert ids, transformers' MoE blocks use
exactly those, weighted by the current router's probabilities at them, and the router still gets a gradient."""

from __future__ import annotations

import pytest
import torch

from hyflow.models.moe_routers import RouterCapture
from hyflow.models.policy import PolicyModel
from hyflow.models.router_replay import find_routers, replay_routing
from tests.engine.engine_testkit import make_tiny_hf_model

# two rows: prompts left-padded to 5, responses right-padded to 4
INPUT_IDS = torch.tensor([[0, 0, 5, 9, 13, 17, 21, 3, 0], [11, 4, 8, 6, 7, 30, 31, 32, 33]])
ATTENTION_MASK = (INPUT_IDS != 0).long()
POSITION_IDS = (ATTENTION_MASK.cumsum(1) - 1).clamp_min(0)
RESPONSES = INPUT_IDS[:, 5:]


def _experts_inputs(lm) -> tuple[list, list]:
    """Hooks that keep, per MoE layer, the expert ids and weights its experts receive in each forward."""
    ids, weights = [], []

    def keep(_module, args):
        ids.append(args[1].clone())
        weights.append(args[2].clone())

    for layer in lm.model.layers:
        if hasattr(layer.mlp, "gate"):
            layer.mlp.experts.register_forward_pre_hook(keep)
    return ids, weights


def _policy(family: str, remove_padding: bool) -> PolicyModel:
    return PolicyModel(make_tiny_hf_model(family), remove_padding=remove_padding)


def _forward(policy, **kwargs):
    return policy(INPUT_IDS, ATTENTION_MASK, POSITION_IDS, RESPONSES, **kwargs)


def _other_experts(record: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Each token's experts shifted by one: distinct, and none of them what the trainer chose."""
    marker = record == 255
    return torch.where(marker, record, ((record.long() + 1) % num_experts).to(record.dtype))


@pytest.mark.parametrize("remove_padding", [False, True])
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "mixtral"])
def test_the_training_forward_uses_the_replayed_experts_even_where_its_router_would_choose_others(
    family, remove_padding
):
    policy = _policy(family, remove_padding)
    with torch.no_grad():
        own_log_probs, _ = _forward(policy, record_routing=True)
    own = policy.routing_record
    assert own.shape == (*INPUT_IDS.shape, len(find_routers(policy.lm)), 2) and own.dtype == torch.uint8
    assert torch.equal(own == 255, ~ATTENTION_MASK.bool()[..., None, None].expand_as(own))  # padding: no record
    replayed = _other_experts(own, num_experts=4)
    ids, _ = _experts_inputs(policy.lm)
    with torch.no_grad():
        log_probs, _ = _forward(policy, routed_experts=replayed)
    real = ATTENTION_MASK.bool()
    expected = replayed[real] if remove_padding else replayed.flatten(0, 1)  # the tokens the model runs on
    for layer, chosen in enumerate(ids):
        recorded = expected[:, layer] != 255
        assert torch.equal(chosen[recorded], expected[:, layer][recorded].long())
    assert not torch.allclose(log_probs, own_log_probs)  # other experts, other log-probs
    with torch.no_grad():  # replaying its own choice changes nothing
        again, _ = _forward(policy, routed_experts=own)
    torch.testing.assert_close(again, own_log_probs, rtol=0, atol=0)


def test_replayed_weights_are_the_routers_probabilities_at_the_replayed_experts_renormalised():
    logits = torch.randn(3, 4)
    replayed = torch.tensor([[2, 0], [255, 255], [1, 3]], dtype=torch.uint8)
    own = torch.tensor([[0, 1], [3, 2], [0, 1]])
    weights, ids = replay_routing(logits, replayed, own, normalize=True, out_dtype=torch.float32)
    assert ids.tolist() == [[2, 0], [3, 2], [1, 3]]  # the row without a record keeps the router's own choice
    probs = logits.softmax(-1)
    chosen = probs.gather(-1, ids)
    torch.testing.assert_close(weights, chosen / chosen.sum(-1, keepdim=True))


def test_under_replay_the_router_still_gets_a_gradient_through_the_weights():
    policy = _policy("qwen3_moe", remove_padding=False)
    with torch.no_grad():
        _forward(policy, record_routing=True)
    replayed = _other_experts(policy.routing_record, num_experts=4)
    log_probs, _ = _forward(policy, routed_experts=replayed)
    log_probs.sum().backward()
    router = find_routers(policy.lm)[0]
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_a_forward_without_routed_experts_routes_as_usual_after_a_replayed_one():
    policy = _policy("mixtral", remove_padding=True)
    with torch.no_grad():
        plain, _ = _forward(policy, record_routing=True)
        _forward(policy, routed_experts=_other_experts(policy.routing_record, num_experts=4))
        after, _ = _forward(policy)
    torch.testing.assert_close(after, plain, rtol=0, atol=0)


def test_routing_of_another_model_is_refused_naming_the_layer_counts():
    policy = _policy("qwen3_moe", remove_padding=False)  # one MoE layer (the other is dense)
    wrong = torch.zeros(*INPUT_IDS.shape, 2, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="2 MoE layers per token, the model has 1 routers"):
        _forward(policy, routed_experts=wrong)


def test_the_load_balancing_capture_made_before_replay_sees_the_replayed_experts():
    policy = _policy("qwen3_moe", remove_padding=False)
    capture = RouterCapture(policy.lm)  # made first, as the actor makes it at start-up
    with torch.no_grad():
        _forward(policy, record_routing=True)  # the replay hooks are made here, after the capture's
        replayed = _other_experts(policy.routing_record, num_experts=4)
        with capture.recording() as routed:
            _forward(policy, routed_experts=replayed)
    valid = ATTENTION_MASK.bool().flatten()
    for layer in range(replayed.shape[2]):
        expected = replayed[:, :, layer].flatten(0, 1)[valid].long()
        assert torch.equal(routed.indices[layer][valid], expected)
