"""DataParallelPPOActor on a tiny Qwen2-VL: per-row images travel with their rows through every micro-batch cut."""

import pytest
import torch

from hyflow import fields as F
from hyflow.config.actor_rollout_ref import ActorConfig
from hyflow.models.loader import load_causal_lm
from hyflow.models.multimodal import freeze_vision_tower, vision_tower
from hyflow.models.policy import PolicyModel
from hyflow.models.tiny_vlm import build_tiny_vlm
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.micro_batch_loop import ForwardSettings
from hyflow.workers.optim import build_optimizer
from tests.vlm_reference import plain_transformers_log_probs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def build_actor(path, remove_padding=False, **overrides):
    config = ActorConfig(ppo_mini_batch_size=6, **overrides)
    config.optim.lr = 1e-2
    policy = PolicyModel(load_causal_lm(path), chunk_size=7, remove_padding=remove_padding)
    return DataParallelPPOActor(config, policy, build_optimizer(policy.parameters(), config.optim), mini_batch_size=6)


@pytest.mark.parametrize("cut", [{"micro_batch_size": 6}, {"micro_batch_size": 4}, {"max_token_len": 80}])
def test_log_probs_with_images_equal_a_plain_transformers_forward_however_the_batch_is_cut(vlm_path, image_batch, cut):
    actor = build_actor(vlm_path)
    data = image_batch
    log_probs, _ = actor.compute_log_prob(data, ForwardSettings(**cut))
    expected = plain_transformers_log_probs(vlm_path, data)
    torch.testing.assert_close(log_probs, expected, rtol=1e-4, atol=1e-4)


def test_an_update_on_image_rows_is_the_same_for_any_micro_batch_size(vlm_path, image_batch):
    states = []
    for micro_batch_size in (6, 3):
        torch.manual_seed(0)
        actor = build_actor(vlm_path, ppo_micro_batch_size_per_gpu=micro_batch_size)
        image_batch.meta_info[F.TEMPERATURE] = 1.0
        actor.update_policy(image_batch)
        states.append({k: v.clone() for k, v in actor.module.state_dict().items()})
    for name, value in states[0].items():
        torch.testing.assert_close(value, states[1][name], rtol=1e-4, atol=1e-4, msg=name)  # lr 1e-2: noise only
    tower = vision_tower(build_actor(vlm_path).module.lm)
    assert not torch.equal(states[0]["lm.model.visual.blocks.0.mlp.fc1.weight"], tower.blocks[0].mlp.fc1.weight)


def test_freeze_vision_tower_keeps_the_encoder_and_trains_its_merger(vlm_path, image_batch):
    actor = build_actor(vlm_path)
    frozen = freeze_vision_tower(actor.module.lm)
    tower = vision_tower(actor.module.lm)
    before = {name: p.detach().clone() for name, p in tower.named_parameters()}
    image_batch.meta_info[F.TEMPERATURE] = 1.0
    actor.update_policy(image_batch)
    assert frozen > 0
    for name, parameter in tower.named_parameters():
        changed = not torch.equal(before[name], parameter)
        assert changed == name.startswith("merger."), name


def test_a_qwen2_5_vl_gets_the_same_treatment(tmp_path, image_batch):
    path = build_tiny_vlm(tmp_path / "qwen2.5-vl", arch="qwen2_5_vl")  # same tokenizer and processor
    log_probs, _ = build_actor(path).compute_log_prob(image_batch, ForwardSettings(micro_batch_size=4))
    torch.testing.assert_close(log_probs, plain_transformers_log_probs(path, image_batch), rtol=1e-4, atol=1e-4)
    assert freeze_vision_tower(load_causal_lm(path)) > 0


@pytest.mark.parametrize("cut", [{"micro_batch_size": 4}, {"micro_batch_size": 3}, {"max_token_len": 70}])
def test_log_probs_with_videos_equal_a_plain_transformers_forward(vlm_path, video_batch, cut):
    log_probs, _ = build_actor(vlm_path).compute_log_prob(video_batch, ForwardSettings(**cut))
    torch.testing.assert_close(log_probs, plain_transformers_log_probs(vlm_path, video_batch), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cut", [{"micro_batch_size": 4}, {"max_token_len": 80}])
@pytest.mark.parametrize("rows", ["image_batch", "video_batch"])
def test_packed_micro_batches_of_vision_rows_give_the_padded_log_probs(vlm_path, request, rows, cut):
    """use_remove_padding: the rows' real tokens packed into one sequence (M-RoPE positions packed row by row,
    varlen attention in the language model only), with fixed-size or token-budget micro-batches."""
    data = request.getfixturevalue(rows)
    packed, _ = build_actor(vlm_path, remove_padding=True).compute_log_prob(data, ForwardSettings(**cut))
    torch.testing.assert_close(packed, plain_transformers_log_probs(vlm_path, data), rtol=1e-4, atol=1e-4)


def test_a_packed_update_on_image_rows_equals_the_padded_update(vlm_path, image_batch):
    states = []
    for remove_padding in (False, True):
        torch.manual_seed(0)
        actor = build_actor(vlm_path, remove_padding=remove_padding, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=80)
        image_batch.meta_info[F.TEMPERATURE] = 1.0
        actor.update_policy(image_batch)
        states.append({k: v.clone() for k, v in actor.module.state_dict().items()})
    for name, value in states[0].items():
        torch.testing.assert_close(value, states[1][name], rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_log_probs_with_videos_on_a_qwen2_5_vl_equal_a_plain_transformers_forward(
    qwen25_vlm_path, qwen25_video_batch, remove_padding
):
    """Qwen2.5-VL's video positions are spaced by time (tokens_per_second x second_per_grid_ts): the actor reads
    the dataset's positions, the plain forward computes its own from second_per_grid_ts."""
    actor = build_actor(qwen25_vlm_path, remove_padding=remove_padding)
    log_probs, _ = actor.compute_log_prob(qwen25_video_batch, ForwardSettings(micro_batch_size=3))
    expected = plain_transformers_log_probs(qwen25_vlm_path, qwen25_video_batch)
    torch.testing.assert_close(log_probs, expected, rtol=1e-4, atol=1e-4)
    seconds = [row.get("second_per_grid_ts") for row in qwen25_video_batch.non_tensor_batch[F.MULTI_MODAL_INPUTS]]
    assert [None if s is None else s.tolist() for s in seconds] == [[1.0], [1.0], [2.0], None]


def test_qwen2_5_vl_videos_without_their_seconds_per_patch_are_refused_with_the_reason(qwen25_vlm_path, video_batch):
    match = r"videos for model_type='qwen2_5_vl' but no second_per_grid_ts.*load_processor"
    with pytest.raises(ValueError, match=match):
        build_actor(qwen25_vlm_path).compute_log_prob(video_batch, ForwardSettings(micro_batch_size=4))
