"""The actor on a tiny mixture-of-experts model: the router's load-balancing loss in the update and the expert-load
metrics, checked against transformers' own router logits and `load_balancing_loss_func`."""

import copy

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from hyflow import fields as F
from hyflow.config.actor_rollout_ref import ActorConfig
from hyflow.config.critic import CriticConfig
from hyflow.models.loader import load_causal_lm, load_value_model
from hyflow.models.policy import PolicyModel
from hyflow.models.tiny import MOE_EXPERTS, MOE_TOP_K, build_tiny_model
from hyflow.protocol import DataProto
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.critic import DataParallelPPOCritic
from hyflow.workers.optim import build_optimizer

from .test_actor_rollout_ref import actor_rollout_ref_config, make_group


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("moe") / "qwen3_moe", arch="qwen3_moe", hidden_size=32)


def build_actor(path: str, remove_padding: bool = False, **overrides) -> DataParallelPPOActor:
    config = ActorConfig(ppo_mini_batch_size=4, grad_clip=1e9, **overrides)
    torch.manual_seed(0)
    policy = PolicyModel(load_causal_lm(path), remove_padding=remove_padding)
    return DataParallelPPOActor(config, policy, build_optimizer(policy.parameters(), config.optim), mini_batch_size=4)


def response_position_mask(data):
    """(B, T): 1 at the positions whose hidden state predicts a response token that the loss counts."""
    response_mask = data.batch[F.RESPONSE_MASK]
    length, response_length = data.batch[F.INPUT_IDS].shape[1], response_mask.shape[1]
    mask = torch.zeros(response_mask.shape[0], length)
    mask[:, length - response_length - 1 : length - 1] = response_mask
    return mask


def naive_router_logits(lm, data):
    batch = data.batch
    inputs = {key: batch[key] for key in (F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS)}
    return lm(**inputs, output_router_logits=True).router_logits  # one (B·T, E) per MoE layer


def zero_advantages(data):
    data.batch[F.ADVANTAGES] = torch.zeros_like(data.batch[F.ADVANTAGES])  # the policy loss has no gradient
    return data


@pytest.mark.parametrize("remove_padding", [False, True])
def test_moe_update_gradient_is_the_router_aux_loss_gradient_over_response_tokens(moe_path, ppo_batch, remove_padding):
    actor = build_actor(moe_path, remove_padding, router_aux_loss_coef=0.5, ppo_micro_batch_size_per_gpu=4)
    data = zero_advantages(ppo_batch(batch_size=4, seed=2))
    reference = load_causal_lm(moe_path)
    expected = load_balancing_loss_func(
        naive_router_logits(reference, data), MOE_EXPERTS, MOE_TOP_K, response_position_mask(data)
    )
    (0.5 * expected).backward()
    grads = {}  # the routers' gradients as backward leaves them (the optimizer step clears .grad)
    for layer in range(2):
        weight = actor.module.lm.model.layers[layer].mlp.gate.weight
        weight.register_hook(lambda grad, layer=layer: grads.setdefault(layer, grad.clone()))

    metrics = actor.update_policy(data)

    assert metrics["actor/router_aux_loss"][0] == pytest.approx(expected.item(), rel=1e-5)
    for layer in range(2):
        expected_grad = reference.model.layers[layer].mlp.gate.weight.grad
        torch.testing.assert_close(grads[layer], expected_grad, rtol=1e-4, atol=1e-7)


def test_router_aux_loss_of_micro_batches_is_their_token_weighted_mean(moe_path, ppo_batch):
    actor = build_actor(moe_path, ppo_micro_batch_size_per_gpu=1)  # coefficient: the model config's
    data = ppo_batch(batch_size=4, seed=3)
    reference = load_causal_lm(moe_path)
    mask = response_position_mask(data)
    per_row = []
    for row in range(4):
        logits = tuple(layer.reshape(4, -1, MOE_EXPERTS)[row] for layer in naive_router_logits(reference, data))
        per_row.append(load_balancing_loss_func(logits, MOE_EXPERTS, MOE_TOP_K, mask[row : row + 1]))
    weights = data.batch[F.RESPONSE_MASK].sum(-1) / data.batch[F.RESPONSE_MASK].sum()

    metrics = actor.update_policy(data)

    assert actor.router_balance.coef == reference.config.router_aux_loss_coef
    expected = sum(w * loss for w, loss in zip(weights, per_row, strict=True))
    assert metrics["actor/router_aux_loss"][0] == pytest.approx(expected.item(), rel=1e-5)


def test_moe_update_reports_each_layers_expert_load_every_interval(moe_path, ppo_batch):
    actor = build_actor(moe_path, ppo_micro_batch_size_per_gpu=2, moe_load_balance_metrics_interval=2)
    data = ppo_batch(batch_size=4, seed=4)
    logits = naive_router_logits(load_causal_lm(moe_path), data)
    mask = response_position_mask(data).reshape(-1)

    first, second = actor.update_policy(data), actor.update_policy(data)

    imbalances = []
    for layer, layer_logits in enumerate(logits):
        chosen = torch.topk(layer_logits, MOE_TOP_K, dim=-1).indices[mask.bool()].reshape(-1)
        share = torch.bincount(chosen, minlength=MOE_EXPERTS).float() / chosen.numel()
        assert first[f"moe/layer_{layer}/load_max"][0] == pytest.approx(share.max().item(), abs=1e-6)
        assert first[f"moe/layer_{layer}/load_min"][0] == pytest.approx(share.min().item(), abs=1e-6)
        imbalances.append(share.max().item() * MOE_EXPERTS)
    assert first["moe/load_imbalance"][0] == pytest.approx(sum(imbalances) / len(imbalances), abs=1e-5)
    assert not any(name.startswith("moe/") for name in second)  # the second update is off the interval


def test_router_aux_loss_coef_on_a_dense_model_is_an_error_naming_the_key(tiny_model_path):
    with pytest.raises(ValueError, match=r"router_aux_loss_coef=0\.01.*no mixture-of-experts routers"):
        build_actor(tiny_model_path, router_aux_loss_coef=0.01)


@pytest.mark.timeout(300)
def test_lora_on_a_moe_model_trains_attention_adapters_and_the_engine_gets_the_merged_weights(moe_path, ppo_batch):
    group = make_group(actor_rollout_ref_config(moe_path, lora_rank=4), rollout=True)
    trainable = {n for n, p in group.worker.actor.module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    assert any("self_attn.q_proj" in name for name in trainable)
    train = ppo_batch(batch_size=8, seed=2)
    metrics = group.update_actor(copy.deepcopy(train)).meta_info[F.METRICS]
    assert "actor/router_aux_loss" in metrics
    prompts = train.select(batch_keys=[F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS])[:4]
    prompts = DataProto.from_dict(
        {k: v[:, :6] for k, v in prompts.batch.items()}, meta_info={F.TEMPERATURE: 1.0, F.DO_SAMPLE: True}
    )
    generated = group.generate_sequences(prompts)
    recomputed = group.compute_log_prob(copy.deepcopy(generated)).batch[F.OLD_LOG_PROBS]
    mask = generated.batch[F.RESPONSE_MASK].bool()
    torch.testing.assert_close(recomputed[mask], generated.batch[F.ROLLOUT_LOG_PROBS][mask], rtol=1e-3, atol=1e-3)


def test_a_critic_on_a_moe_backbone_trains_its_experts_with_or_without_padding(moe_path, ppo_batch):
    data = ppo_batch(batch_size=4, seed=6)
    values = []
    for remove_padding in (False, True):
        config = CriticConfig(ppo_epochs=1, shuffle=False, loss_agg_mode="token-mean", ppo_micro_batch_size_per_gpu=2)
        model = load_value_model(moe_path)
        if remove_padding:
            model.enable_remove_padding()
        torch.nn.init.normal_(model.value_head.weight, generator=torch.Generator().manual_seed(0))
        critic = DataParallelPPOCritic(config, model, build_optimizer(model.parameters(), config.optim), 4)
        experts = model.backbone.layers[0].mlp.experts.gate_up_proj.detach().clone()
        values.append(critic.compute_values(copy.deepcopy(data)))
        critic.update_critic(copy.deepcopy(data))
        assert not torch.equal(model.backbone.layers[0].mlp.experts.gate_up_proj, experts)
    torch.testing.assert_close(values[0], values[1], rtol=1e-5, atol=1e-5)
