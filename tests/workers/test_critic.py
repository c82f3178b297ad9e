"""DataParallelPPOCritic and the value model in one process."""

import copy
import shutil

import pytest
import torch

from hyflow import fields as F
from hyflow.config.critic import CriticConfig
from hyflow.models.loader import load_value_model
from hyflow.models.value_head import save_value_head
from hyflow.workers.critic import DataParallelPPOCritic
from hyflow.workers.micro_batch_loop import ForwardSettings
from hyflow.workers.optim import build_optimizer


def build_critic(path: str, **overrides) -> DataParallelPPOCritic:
    config = CriticConfig(ppo_epochs=1, shuffle=False, loss_agg_mode="token-mean", use_dynamic_bsz=False, **overrides)
    config.optim.lr = 1e-2
    model = load_value_model(path)
    return DataParallelPPOCritic(config, model, build_optimizer(model.parameters(), config.optim), mini_batch_size=4)


def test_a_fresh_value_head_predicts_zero_and_values_are_masked(tiny_model_path, ppo_batch):
    critic = build_critic(tiny_model_path)
    data = ppo_batch(batch_size=4, seed=0)
    values = critic.compute_values(data)
    assert values.shape == data.batch[F.RESPONSES].shape
    assert torch.count_nonzero(values) == 0


def test_values_are_read_one_position_before_each_response_token(tiny_model_path, ppo_batch):
    critic = build_critic(tiny_model_path)
    torch.nn.init.normal_(critic.module.value_head.weight)
    data = ppo_batch(batch_size=3, seed=1)
    values = critic.compute_values(data, ForwardSettings(micro_batch_size=2))
    batch = data.batch
    with torch.no_grad():
        full = critic.module(batch[F.INPUT_IDS], batch[F.ATTENTION_MASK], batch[F.POSITION_IDS])
    response_length = batch[F.RESPONSES].shape[1]
    expected = full[:, -response_length - 1 : -1] * batch[F.RESPONSE_MASK]
    torch.testing.assert_close(values, expected)


def test_critic_update_is_independent_of_micro_batch_size_and_lowers_the_loss(tiny_model_path, ppo_batch):
    data = ppo_batch(batch_size=8, seed=2)
    results = []
    for setting in ({"ppo_micro_batch_size_per_gpu": 4}, {"ppo_micro_batch_size_per_gpu": 1}):
        critic = build_critic(tiny_model_path, **setting)
        first = critic.update_critic(copy.deepcopy(data))
        second = critic.update_critic(copy.deepcopy(data))
        results.append((first, second, [p.detach().clone() for p in critic.module.parameters()]))
    (first, second, params), (first_b, _, params_b) = results
    assert first["critic/vf_loss"] == pytest.approx(first_b["critic/vf_loss"], rel=1e-4)
    assert sum(second["critic/vf_loss"]) < sum(first["critic/vf_loss"])
    for p, q in zip(params, params_b):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_value_head_is_restored_from_the_model_folder(tiny_model_path, tmp_path):
    folder = tmp_path / "critic"
    shutil.copytree(tiny_model_path, folder)
    state = {"weight": torch.full((1, 32), 0.5), "bias": torch.tensor([2.0])}
    save_value_head(state, str(folder))
    model = load_value_model(folder)
    torch.testing.assert_close(model.value_head.weight.detach(), state["weight"])


def test_removing_padding_gives_the_same_values_and_update(tiny_model_path, ppo_batch):
    data = ppo_batch(batch_size=8, seed=6)
    results = []
    for remove_padding in (False, True):
        torch.manual_seed(0)
        critic = build_critic(tiny_model_path)
        torch.nn.init.normal_(critic.module.value_head.weight, std=0.1)  # a zero head would hide differences
        if remove_padding:
            critic.module.enable_remove_padding()
        values = critic.compute_values(copy.deepcopy(data), ForwardSettings(micro_batch_size=3))
        metrics = critic.update_critic(copy.deepcopy(data))
        results.append((values, metrics, [p.detach().clone() for p in critic.module.parameters()]))
    (padded_values, padded_metrics, padded_params), (values, metrics, params) = results
    torch.testing.assert_close(values, padded_values, rtol=1e-5, atol=1e-5)
    assert metrics["critic/vf_loss"] == pytest.approx(padded_metrics["critic/vf_loss"], rel=1e-4)
    for param, expected in zip(params, padded_params):
        torch.testing.assert_close(param, expected, rtol=1e-4, atol=1e-4)  # Adam at lr 1e-2 amplifies fp32 noise
