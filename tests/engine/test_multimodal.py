"""Image prompts in the engine: the tiny Qwen2-VL / Qwen2.5-VL give transformers' logits and tokens (fp32, CPU),
share image blocks only between prompts with the same image, and follow weight syncs of the vision tower."""

from __future__ import annotations

import pytest
import torch

from hyflow.engine.block_manager import BlockManager
from hyflow.engine.config import SamplingParams
from hyflow.engine.multimodal import VisionSpec, prompt_images
from hyflow.engine.sequence import Sequence

from .vlm_testkit import (
    engine_inputs,
    hf_greedy,
    hf_logits,
    image_prompt,
    make_engine,
    make_tiny_vlm,
    random_image,
    recording_logits,
)

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def vlm(request, tmp_path_factory):
    return make_tiny_vlm(tmp_path_factory.mktemp(request.param), arch=request.param)


@pytest.mark.timeout(120)
def test_image_prefill_and_decode_logits_equal_transformers_forward(vlm):
    model, processor, _ = vlm
    inputs = image_prompt(processor, [random_image(0)])
    prompt, images = engine_inputs(inputs)
    engine = make_engine(model, num_scheduler_steps=1)
    recorded = recording_logits(engine)
    tokens = engine.generate([prompt], GREEDY, multi_modal_inputs=[images])[0].outputs[0].token_ids
    expected = hf_logits(model, inputs, tokens[:-1])  # after the prompt, then after each token fed back
    torch.testing.assert_close(torch.cat(recorded), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.timeout(120)
def test_greedy_tokens_equal_transformers_generate_for_two_images_behind_the_same_token_ids(vlm):
    model, processor, _ = vlm
    first, second = (image_prompt(processor, [random_image(seed)]) for seed in (1, 2))
    assert torch.equal(first["input_ids"], second["input_ids"])  # only the pictures differ
    two_images = image_prompt(processor, [random_image(3), random_image(4, size=(56, 56))], "Compare them.")
    text_only = processor(text=["plain words only"], return_tensors="pt")
    requests = [engine_inputs(inputs) for inputs in (first, second, two_images)]
    prompts = [prompt for prompt, _ in requests] + [text_only["input_ids"][0].tolist()]
    images = [image_inputs for _, image_inputs in requests] + [None]
    outputs = make_engine(model).generate(prompts, GREEDY, multi_modal_inputs=images)
    expected = [hf_greedy(model, inputs, 6) for inputs in (first, second, two_images)]
    expected.append(model.generate(**text_only, max_new_tokens=6, min_new_tokens=6, do_sample=False)[0, -6:].tolist())
    assert [out.outputs[0].token_ids for out in outputs] == expected
    assert expected[0] != expected[1]


def _sequence(prompt: list[int], images: dict, config) -> Sequence:
    view = prompt_images(prompt, images, VisionSpec.from_hf_config(config), "r")
    return Sequence("r", prompt, GREEDY, 0, images=view)


def test_prefix_blocks_are_shared_for_the_same_image_and_not_for_another_image_behind_the_same_ids(vlm):
    model, processor, _ = vlm
    prompt, image = engine_inputs(image_prompt(processor, [random_image(5)]))
    _, other_image = engine_inputs(image_prompt(processor, [random_image(6)]))
    manager = BlockManager(num_blocks=32, block_size=4)
    first, same, other = (_sequence(prompt, i, model.config) for i in (image, image, other_image))
    for seq in (first, same, other):
        manager.allocate(seq)
    full_blocks_before_last = (len(prompt) - 1) // 4 * 4
    assert same.num_computed_tokens == full_blocks_before_last
    image_start = prompt.index(model.config.image_token_id)
    assert other.num_computed_tokens == image_start // 4 * 4  # the text before the image only


@pytest.mark.timeout(120)
def test_the_samples_of_one_image_prompt_share_its_blocks(vlm):
    model, processor, _ = vlm
    prompt, images = engine_inputs(image_prompt(processor, [random_image(7)]))
    engine = make_engine(model)
    engine.add_request(prompt, SamplingParams(n=4, max_tokens=4, seed=0), multi_modal_inputs=images)
    engine.step()
    shared, own = (len(prompt) - 1) // 8, 4 * (-(-len(prompt) // 8) - (len(prompt) - 1) // 8)
    assert engine.block_manager.num_blocks - engine.block_manager.num_free_blocks == shared + own


@pytest.mark.timeout(120)
def test_a_weight_sync_with_new_vision_weights_gives_the_new_models_outputs(vlm, tmp_path):
    model, processor, _ = vlm
    inputs = image_prompt(processor, [random_image(8)])
    prompt, images = engine_inputs(inputs)
    engine = make_engine(model)
    before = engine.generate([prompt], GREEDY, multi_modal_inputs=[images])[0].outputs[0].token_ids
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "visual" in name and param.dim() > 1:
                param.normal_(0, 0.5)
    expected = hf_greedy(model, inputs, 6)
    assert expected != before  # the new vision tower changes the answer
    loaded = engine.load_weights((name, tensor.clone()) for name, tensor in model.state_dict().items())
    assert loaded == len(dict(model.named_parameters(remove_duplicate=False))) - 1  # lm_head tied to embed_tokens
    engine.sleep()
    engine.wake()
    assert engine.generate([prompt], GREEDY, multi_modal_inputs=[images])[0].outputs[0].token_ids == expected


def test_images_that_do_not_match_the_prompt_are_refused_naming_the_request(vlm):
    model, processor, _ = vlm
    prompt, images = engine_inputs(image_prompt(processor, [random_image(9)]))
    engine = make_engine(model)
    one_pad_less = list(prompt)
    one_pad_less.remove(model.config.image_token_id)
    with pytest.raises(ValueError, match=r"request 'short'.*5 image pad tokens .* need 6"):
        engine.add_request(one_pad_less, GREEDY, "short", multi_modal_inputs=images)
    with pytest.raises(ValueError, match=r"request 'bare'.*image_grid_thw"):
        engine.add_request(prompt, GREEDY, "bare", multi_modal_inputs={"pixel_values": images["pixel_values"]})
    video = {"pixel_values_videos": images["pixel_values"]}
    with pytest.raises(ValueError, match=r"request 'video'.*lacks \['video_grid_thw'\]"):
        engine.add_request(prompt, GREEDY, "video", multi_modal_inputs=video)
    video["video_grid_thw"] = images["image_grid_thw"]
    with pytest.raises(ValueError, match=r"request 'video'.*0 video pad tokens .* need 6"):
        engine.add_request(prompt, GREEDY, "video", multi_modal_inputs=video)
    assert not engine.has_unfinished_requests()


def test_a_text_model_refuses_image_inputs():
    from .engine_testkit import make_tiny_hf_model

    engine = make_engine(make_tiny_hf_model("qwen2"))
    images = {"pixel_values": torch.zeros(4, 1176), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    with pytest.raises(ValueError, match="has no vision tower"):
        engine.add_request([5, 6, 7], GREEDY, "r", multi_modal_inputs=images)


@pytest.mark.timeout(120)
def test_preempted_image_sequences_are_recomputed_with_their_images_and_positions(vlm):
    model, processor, _ = vlm
    requests = [engine_inputs(image_prompt(processor, [random_image(seed)])) for seed in (10, 11, 12)]
    prompts, images = [p for p, _ in requests], [i for _, i in requests]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = make_engine(model).generate(prompts, params, multi_modal_inputs=images)
    small = make_engine(model, num_kv_blocks=12)
    outputs = small.generate(prompts, params, multi_modal_inputs=images)
    assert small.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in expected]
