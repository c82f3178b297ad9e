"""Video prompts in the engine: the tiny Qwen2-VL / Qwen2.5-VL give transformers' greedy tokens (fp32, CPU) for a
video and for an image beside a video, Qwen2.5-VL's time-scaled positions included, and a video's blocks are
shared only where its frames and its temporal positions are the same."""

from __future__ import annotations

import pytest
import torch

from hyflow.engine.block_manager import BlockManager
from hyflow.engine.config import SamplingParams
from hyflow.engine.multimodal import VisionSpec, prompt_images
from hyflow.engine.sequence import Sequence

from .vlm_testkit import (
    hf_greedy,
    make_engine,
    make_tiny_vlm,
    random_image,
    recording_logits,
    video_prompt,
    vision_engine_inputs,
)

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def vlm(request, tmp_path_factory):
    return make_tiny_vlm(tmp_path_factory.mktemp(request.param), arch=request.param)


def frames(seed: int, count: int = 4) -> list:
    return [random_image(seed + i, size=(56, 56)) for i in range(count)]


@pytest.mark.timeout(180)
def test_video_prompts_give_transformers_greedy_tokens(vlm):
    model, processor, _ = vlm
    cases = [
        video_prompt(processor, frames(0)),
        video_prompt(processor, frames(0), fps=0.5),  # Qwen2.5-VL: 4 s per temporal patch, positions 16 apart
        video_prompt(processor, frames(10, count=6), image=random_image(20)),
    ]
    requests = [vision_engine_inputs(inputs) for inputs in cases]
    outputs = make_engine(model).generate(
        [prompt for prompt, _ in requests], GREEDY, multi_modal_inputs=[inputs for _, inputs in requests]
    )
    assert [out.outputs[0].token_ids for out in outputs] == [hf_greedy(model, inputs, 6) for inputs in cases]
    if model.config.model_type == "qwen2_5_vl":
        assert cases[1]["second_per_grid_ts"].tolist() == [4.0]


def _sequence(inputs: dict, config) -> Sequence:
    prompt, vision = vision_engine_inputs(inputs)
    view = prompt_images(prompt, vision, VisionSpec.from_hf_config(config), "r")
    return Sequence("r", prompt, GREEDY, 0, images=view)


def test_a_video_at_another_frame_rate_shares_its_blocks_only_where_its_positions_are_the_same(vlm):
    model, processor, _ = vlm
    clip = frames(30)
    first, same, slower = (_sequence(video_prompt(processor, clip, fps), model.config) for fps in (2.0, 2.0, 0.5))
    manager = BlockManager(num_blocks=64, block_size=4)
    for seq in (first, same, slower):
        manager.allocate(seq)
    prompt = first.token_ids
    assert same.num_computed_tokens == (len(prompt) - 1) // 4 * 4
    video_start = prompt.index(model.config.video_token_id)
    time_scaled = model.config.model_type == "qwen2_5_vl"  # Qwen2-VL's video positions ignore the frame rate
    assert slower.num_computed_tokens == (video_start // 4 * 4 if time_scaled else same.num_computed_tokens)


def test_video_inputs_that_do_not_match_the_prompt_are_refused_naming_the_request(vlm):
    model, processor, _ = vlm
    inputs = video_prompt(processor, frames(40))
    prompt, vision = vision_engine_inputs(inputs)
    engine = make_engine(model)
    with pytest.raises(ValueError, match=r"request 'short'.*7 video pad tokens .* need 8"):
        short = list(prompt)
        short.remove(model.config.video_token_id)
        engine.add_request(short, GREEDY, "short", multi_modal_inputs=vision)
    with pytest.raises(ValueError, match=r"request 'seconds'.*second_per_grid_ts has 2 entries for 1 video"):
        engine.add_request(prompt, GREEDY, "seconds", multi_modal_inputs={**vision, "second_per_grid_ts": [1, 1]})
    assert not engine.has_unfinished_requests()


@pytest.mark.timeout(180)
def test_a_clip_whose_positions_reach_past_the_text_after_it_decodes_as_a_forward_over_prompt_and_response(vlm):
    """A slow clip (0.25 fps: 8 s per temporal patch; Qwen2.5-VL's temporal positions 32 apart) ends the prompt's
    largest position beyond its last: the response continues after the prompt's text, as a transformers forward
    over prompt + response (the training batch's positions) places it."""
    model, processor, _ = vlm
    inputs = video_prompt(processor, frames(50, count=6), fps=0.25)
    prompt, vision = vision_engine_inputs(inputs)
    engine = make_engine(model, num_scheduler_steps=1)
    recorded = recording_logits(engine)
    tokens = engine.generate([prompt], GREEDY, multi_modal_inputs=[vision])[0].outputs[0].token_ids
    positions = prompt_images(prompt, vision, VisionSpec.from_hf_config(model.config), "r").positions
    if model.config.model_type == "qwen2_5_vl":
        assert int(positions.max()) > int(positions[:, -1].max())  # the case under test
    ids = torch.tensor([prompt + tokens[:-1]])
    types = torch.zeros_like(ids)
    types[0, : len(prompt)] = inputs["mm_token_type_ids"][0]
    video = {key: value for key, value in vision.items() if "video" in key or key == "second_per_grid_ts"}
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types, **video).logits[0]
    torch.testing.assert_close(torch.cat(recorded), logits[len(prompt) - 1 :], atol=1e-5, rtol=1e-5)
