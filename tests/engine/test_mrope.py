"""M-RoPE in the engine: the position formula equals transformers' rope index, and image sequences decode through
the CUDA-graph path (its buffers and padding on CPU; the real graphs on a GPU) as they do eagerly."""

from __future__ import annotations

import pytest
import torch

from hyflow.engine.config import SamplingParams
from hyflow.engine.models.mrope import mrope_positions

from .engine_testkit import assert_same_outputs, engine_outputs
from .test_multi_step import EagerDecodeGraphs
from .vlm_testkit import engine_inputs, hf_greedy, image_prompt, make_engine, make_tiny_vlm, random_image


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return make_tiny_vlm(tmp_path_factory.mktemp("qwen2_vl"))


def test_mrope_positions_and_decode_offset_equal_transformers_rope_index(vlm):
    model, processor, _ = vlm
    inputs = image_prompt(processor, [random_image(0), random_image(1, size=(56, 112))], "Which is taller?")
    grids = {model.config.image_token_id: [tuple(grid) for grid in inputs["image_grid_thw"].tolist()]}
    merge_size = model.config.vision_config.spatial_merge_size
    positions, delta = mrope_positions(inputs["input_ids"][0].tolist(), grids, merge_size)
    expected, expected_delta = model.model.get_rope_index(
        inputs["input_ids"], inputs["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"]
    )
    assert torch.equal(positions, expected[:, 0])
    assert delta == int(expected_delta) < 0  # 4 + 8 image tokens take 3 + 4 positions


def _image_requests(processor) -> tuple[list[list[int]], list[dict | None]]:
    requests = [engine_inputs(image_prompt(processor, [random_image(seed)])) for seed in (2, 3)]
    text = processor(text=["no picture here"], return_tensors="pt")["input_ids"][0].tolist()
    return [prompt for prompt, _ in requests] + [text], [images for _, images in requests] + [None]


PARAMS = [
    SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=4, ignore_eos=True),
    SamplingParams(temperature=0, max_tokens=9, ignore_eos=True),
    SamplingParams(temperature=0.8, top_k=10, max_tokens=7, seed=2, ignore_eos=True),
]


@pytest.mark.timeout(120)
def test_image_rows_decode_through_the_graph_buffers_with_their_rotary_shift(vlm):
    model, processor, _ = vlm
    prompts, images = _image_requests(processor)
    expected = [
        [(o.token_ids, o.finish_reason, o.log_probs, None) for o in out.outputs]
        for out in make_engine(model, num_scheduler_steps=1).generate(prompts, PARAMS, multi_modal_inputs=images)
    ]
    engine = make_engine(model)
    runner = engine.runner
    runner.graphs = graphs = EagerDecodeGraphs(runner.forward, runner.kv_cache, engine.config, engine.device)
    actual = [
        [(o.token_ids, o.finish_reason, o.log_probs, None) for o in out.outputs]
        for out in engine.generate(prompts, PARAMS, multi_modal_inputs=images)
    ]
    assert_same_outputs(actual, expected)
    assert {key[4] for key in graphs.window_graphs} == {True}  # every window held image rows


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_image_prompts_on_cuda_with_cuda_graphs_give_transformers_greedy_tokens(vlm):
    model, processor, _ = vlm
    cuda_model = model.to("cuda")
    inputs = [image_prompt(processor, [random_image(seed)]).to("cuda") for seed in (4, 5)]
    requests = [engine_inputs(x) for x in inputs]
    expected = [hf_greedy(cuda_model, x, 12) for x in inputs]
    for steps in (8, 1):  # decode windows (window-step graphs), then single steps (step graphs)
        engine = make_engine(cuda_model, num_scheduler_steps=steps, device="cuda")
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        outputs = engine.generate([p for p, _ in requests], params, multi_modal_inputs=[i for _, i in requests])
        assert [out.outputs[0].token_ids for out in outputs] == expected
        graphs = engine.runner.graphs
        assert any(key[4] for key in graphs.window_graphs) if steps > 1 else any(key[2] for key in graphs.graphs)
    model.to("cpu")


def test_text_rows_keep_the_unshifted_graphs(vlm):
    model, _, _ = vlm
    engine = make_engine(model)
    runner = engine.runner
    runner.graphs = graphs = EagerDecodeGraphs(runner.forward, runner.kv_cache, engine.config, engine.device)
    reference = make_engine(model, num_scheduler_steps=1)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    assert_same_outputs(engine_outputs(engine, prompts, PARAMS[1:]), engine_outputs(reference, prompts, PARAMS[1:]))
    assert {key[4] for key in graphs.window_graphs} == {False}
