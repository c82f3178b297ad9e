"""Agent loops on a vision-language model: image prompts, tools that return images, and the trajectory's training.

A scripted server plays the model (so the episode calls the zoom tool), the tiny Qwen2-VL checks the result: the
tool's crop joins the conversation as image pads under mask 0, every turn's request carries all images so far,
and the actor's log-probs over the whole multi-image trajectory equal a plain transformers forward. Generation for
image prompts runs through `rollout.name=hf` (`HFRollout.generate` behind `LocalEngineServer`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

import hyflow.agent
from hyflow import fields as F
from hyflow.agent.manager import AgentLoopManager
from hyflow.agent.server import LocalEngineServer
from hyflow.agent.tool_agent import ToolAgentLoop
from hyflow.agent.tools.image_zoom import ImageZoomTool
from hyflow.agent.vision import encode_prompt_with_images
from hyflow.config.actor_rollout_ref import ActorConfig, RolloutConfig
from hyflow.data.multimodal import image_features
from hyflow.engine.config import SamplingParams
from hyflow.models.loader import load_causal_lm
from hyflow.models.policy import PolicyModel
from hyflow.models.processor import load_processor
from hyflow.models.tiny_vlm import build_tiny_vlm
from hyflow.protocol import DataProto
from hyflow.rollout.hf_rollout import HFRollout
from hyflow.rollout.worker_rollout import EngineRollout, build_rollout
from hyflow.trainer.stages import object_array
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.micro_batch_loop import ForwardSettings
from tests.agent.conftest import ScriptedServer, tool_call
from tests.vlm_reference import plain_transformers_log_probs

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_torch_thread")]

ZOOM_TOOLS = Path(hyflow.agent.__file__).parent / "configs" / "image_zoom_tool.yaml"
QUESTION = [{"role": "user", "content": "<image>Which colour is the top-left square?"}]


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="module")
def processor(vlm_path):
    return load_processor(vlm_path)


def figure() -> Image.Image:
    """112x112 pixels (16 image tokens) with a red square in the top-left quarter."""
    image = Image.new("RGB", (112, 112), "white")
    ImageDraw.Draw(image).rectangle([0, 0, 55, 55], fill="red")
    return image


def zoom_script(prompt: str, turn: int) -> str:
    return tool_call("image_zoom_in_tool", bbox_2d=[0, 0, 56, 56]) if turn == 0 else "red"


def run_tool_agent(context, image):
    params = SamplingParams(temperature=1.0, max_tokens=context.response_length)
    row = {"raw_prompt": QUESTION, "multi_modal_data": {"image": [image]}}
    return asyncio.run(ToolAgentLoop(context).run(params, request_id="conv-0", **row))


def pads(ids, processor) -> int:
    return sum(token == processor.image_token_id for token in ids)


def test_a_tool_image_joins_the_conversation_as_image_pads_under_mask_zero(processor, make_context):
    server = ScriptedServer(processor.tokenizer, zoom_script)
    output = run_tool_agent(make_context(server, tools=[ImageZoomTool()], processor=processor), figure())
    assert output.finish_reason == "stop" and output.metrics.num_tool_calls == 1
    assert pads(output.prompt_ids, processor) == 16
    tool_tokens = [t for t, m in zip(output.response_ids, output.response_mask) if m == 0]
    assert pads(tool_tokens, processor) == 4  # the 56x56 crop: 2x2 merged patches, all under mask 0
    assert pads([t for t, m in zip(output.response_ids, output.response_mask) if m == 1], processor) == 0
    inputs = output.multi_modal_inputs
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8], [1, 4, 4]]
    crop = image_features(processor, [figure().crop((0, 0, 56, 56))])["pixel_values"]
    torch.testing.assert_close(inputs["pixel_values"][64:], crop)


def test_every_turn_generates_with_all_the_images_its_tokens_hold(processor, make_context):
    server = ScriptedServer(processor.tokenizer, zoom_script)
    run_tool_agent(make_context(server, tools=[ImageZoomTool()], processor=processor), figure())
    for call in server.calls:
        grids = call["multi_modal_inputs"]["image_grid_thw"]
        num_tokens = int((grids.prod(-1) // 4).sum())
        assert pads(call["prompt_ids"], processor) == num_tokens
    assert [len(call["multi_modal_inputs"]["image_grid_thw"]) for call in server.calls] == [1, 2]


def test_a_tool_image_that_would_overflow_the_response_is_left_out(processor, make_context):
    server = ScriptedServer(processor.tokenizer, zoom_script)
    length = len(processor.tokenizer.encode(zoom_script("", 0))) + 12  # room for the text, not for the pads
    output = run_tool_agent(
        make_context(server, [ImageZoomTool()], response_length=length, processor=processor), figure()
    )
    assert output.finish_reason == "length"
    assert output.multi_modal_inputs["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert pads(output.response_ids, processor) == 0


def test_a_text_only_model_drops_tool_images_with_a_warning(processor, make_context, caplog):
    class FixedImageTool(ImageZoomTool):
        takes_images = False

        async def create(self, instance_id=None, **kwargs):
            return await super().create(instance_id, image_data=[figure()])

    server = ScriptedServer(processor.tokenizer, zoom_script)
    with caplog.at_level(logging.WARNING):
        output = run_tool_agent(make_context(server, tools=[FixedImageTool()]), figure())
    assert "no processor (text only): dropped" in caplog.text
    assert output.multi_modal_inputs is None and output.metrics.num_tool_calls == 1


def rollout_config(response_length: int = 200) -> RolloutConfig:
    config = RolloutConfig(prompt_length=64, response_length=response_length)
    config.multi_turn.enable = True
    config.multi_turn.tool_config_path = str(ZOOM_TOOLS)
    return config


VIDEO_QUESTION = [{"role": "user", "content": "<video>Which colour comes last?"}]


def clip() -> list[Image.Image]:
    """Four 56x56 frames: a (2, 4, 4) video grid, 8 tokens."""
    return [Image.new("RGB", (56, 56), colour) for colour in ("red", "green", "blue", "yellow")]


def image_prompts(n: int, agent_name: str = "tool_agent", video: bool = False) -> DataProto:
    rows = {
        F.RAW_PROMPT: [VIDEO_QUESTION if video else QUESTION] * n,
        F.MULTI_MODAL_DATA: [{"image": [], "video": [clip()]} if video else {"image": [figure()]}] * n,
        F.AGENT_NAME: [agent_name] * n,
    }
    return DataProto.from_dict(non_tensors=rows)


def actor_log_probs(path, data) -> torch.Tensor:
    policy = PolicyModel(load_causal_lm(path), chunk_size=7)
    actor = DataParallelPPOActor(ActorConfig(ppo_mini_batch_size=2), policy)
    return actor.compute_log_prob(data, ForwardSettings(micro_batch_size=2))[0]


def test_a_multi_image_trajectory_trains_like_a_plain_transformers_forward(vlm_path, processor):
    server = ScriptedServer(processor.tokenizer, zoom_script)
    manager = AgentLoopManager(rollout_config(), processor.tokenizer, [server], processor=processor)
    data = manager.generate_sequences(image_prompts(3))
    assert data.batch[F.POSITION_IDS].shape == (3, 3, 64 + 200)
    assert [len(row["image_grid_thw"]) for row in data.non_tensor_batch[F.MULTI_MODAL_INPUTS]] == [2, 2, 2]
    torch.testing.assert_close(
        actor_log_probs(vlm_path, data), plain_transformers_log_probs(vlm_path, data), rtol=1e-4, atol=1e-4
    )


def test_a_video_prompt_runs_the_tool_agent_loop_and_trains_like_a_plain_forward(vlm_path, processor):
    server = ScriptedServer(processor.tokenizer, ["It ends with yellow."])
    manager = AgentLoopManager(rollout_config(), processor.tokenizer, [server], processor=processor)
    data = manager.generate_sequences(image_prompts(2, video=True))
    (inputs, _) = data.non_tensor_batch[F.MULTI_MODAL_INPUTS]
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]] and "pixel_values" not in inputs
    assert sum(t == processor.video_token_id for t in server.calls[0]["prompt_ids"]) == 8
    torch.testing.assert_close(
        actor_log_probs(vlm_path, data), plain_transformers_log_probs(vlm_path, data), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize(
    ("rollout_name", "agent_name", "video"),
    [
        ("hf", "single_turn_agent", False),
        ("hf", "tool_agent", False),
        ("hf", "tool_agent", True),
        ("hyflow", "tool_agent", False),
        ("hyflow", "tool_agent", True),  # the engine's video prefill
    ],
)
def test_image_prompts_generate_through_the_rollout_with_their_images(
    vlm_path, processor, rollout_name, agent_name, video
):
    """The rollout behind the agent server (`rollout.name=hf`: transformers.generate; `hyflow`: the engine's
    image prefill): the sampled tokens' log-probs are the actor's on the trajectory, which they could only be if
    generation saw the same images (up to the small probability of the vision tokens, which the rollout never
    samples)."""
    config = rollout_config(response_length=12)
    if rollout_name == "hf":
        rollout = HFRollout(load_causal_lm(vlm_path), processor.tokenizer, response_length=12)
    else:
        config.name, config.max_num_batched_tokens = "hyflow", 256
        rollout = build_rollout(config, vlm_path, processor.tokenizer)
        assert isinstance(rollout, EngineRollout)
    manager = AgentLoopManager(config, processor.tokenizer, [LocalEngineServer(rollout)], processor=processor)
    prompts = image_prompts(2, agent_name, video)
    if agent_name == "single_turn_agent":  # the dataset's own ids and inputs, as the trainer hands them over
        ids, inputs = encode_prompt_with_images(processor, QUESTION, [figure()], [])
        prompts.non_tensor_batch[F.RAW_PROMPT_IDS] = object_array([ids, ids])
        prompts.non_tensor_batch[F.MULTI_MODAL_INPUTS] = object_array([inputs, inputs])
    data = manager.generate_sequences(prompts)
    mask = data.batch[F.RESPONSE_MASK].bool()
    assert mask.any() and pads(data.batch[F.RESPONSES][mask].tolist(), processor) == 0
    rollout_lp = data.batch[F.ROLLOUT_LOG_PROBS][mask]
    torch.testing.assert_close(rollout_lp, actor_log_probs(vlm_path, data)[mask], rtol=0, atol=1e-2)


@pytest.mark.parametrize("agent_name", ["single_turn_agent", "tool_agent"])
def test_image_prompts_generate_through_the_native_engine_with_the_actors_log_probs(vlm_path, processor, agent_name):
    """The engine rollout (its own image prefill) behind the agent server: the sampled tokens' log-probs are the
    actor's on the trajectory (its full distribution: nothing is suppressed, a vision token would end the turn)."""
    from hyflow.rollout.worker_rollout import EngineRollout

    config = rollout_config(response_length=12)
    rollout = EngineRollout(vlm_path, config, processor.tokenizer)
    manager = AgentLoopManager(config, processor.tokenizer, [LocalEngineServer(rollout)], processor=processor)
    data = manager.generate_sequences(image_prompts(2, agent_name))
    mask = data.batch[F.RESPONSE_MASK].bool()
    assert mask.any() and pads(data.batch[F.RESPONSES][mask].tolist(), processor) == 0
    rollout_lp = data.batch[F.ROLLOUT_LOG_PROBS][mask]
    torch.testing.assert_close(rollout_lp, actor_log_probs(vlm_path, data)[mask], rtol=1e-4, atol=1e-4)
