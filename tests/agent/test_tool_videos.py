"""Tools that return videos: the clip joins the conversation as video pads under mask 0 (after the tool's images),
every later turn generates with it, and the trajectory trains like a plain transformers forward, Qwen2.5-VL's
time-scaled positions of the tool's video included. A scripted server plays the model."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from PIL import Image

from hyflow import fields as F
from hyflow.agent.manager import AgentLoopManager
from hyflow.agent.tool_agent import ToolAgentLoop
from hyflow.agent.tools.base import BaseTool, ToolResponse
from hyflow.config.actor_rollout_ref import RolloutConfig
from hyflow.engine.config import SamplingParams
from hyflow.models.processor import load_processor
from hyflow.models.tiny_vlm import build_tiny_vlm
from tests.agent.conftest import ScriptedServer, tool_call
from tests.agent.test_agent_images import actor_log_probs
from tests.vlm_reference import plain_transformers_log_probs

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_torch_thread")]

QUESTION = [{"role": "user", "content": "<image>What happened before this picture?"}]
COLOURS = ("red", "green", "blue", "yellow")


class ReplayTool(BaseTool):
    """`replay_clip`: shows the model the clip before the picture, four 56x56 frames at 1 fps, and a still."""

    default_schema = {
        "type": "function",
        "function": {
            "name": "replay_clip",
            "description": "Replay the clip that led to the picture.",
            "parameters": {"type": "object", "properties": {}},
        },
    }

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        frames = [Image.new("RGB", (56, 56), colour) for colour in COLOURS]
        response = ToolResponse(text="The clip.", image=[frames[-1]], video=[{"video": frames, "fps": 1.0}])
        return response, 0.0, {}


def replay_script(prompt: str, turn: int) -> str:
    return tool_call("replay_clip") if turn == 0 else "It was yellow."


def run_episode(context, seed: int = 0):
    params = SamplingParams(temperature=1.0, max_tokens=context.response_length)
    row = {"raw_prompt": QUESTION, "multi_modal_data": {"image": [Image.new("RGB", (56, 56), "white")]}}
    return asyncio.run(ToolAgentLoop(context).run(params, request_id=f"conv-{seed}", **row))


def count(ids: list[int], token_id: int) -> int:
    return sum(token == token_id for token in ids)


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def vlm(request, tmp_path_factory):
    path = build_tiny_vlm(tmp_path_factory.mktemp(request.param), arch=request.param)
    return path, load_processor(path)


def test_a_tool_video_joins_the_conversation_as_video_pads_under_mask_zero(vlm, make_context):
    _, processor = vlm
    server = ScriptedServer(processor.tokenizer, replay_script)
    output = run_episode(make_context(server, tools=[ReplayTool()], processor=processor))
    assert output.finish_reason == "stop" and output.metrics.num_tool_calls == 1
    context_ids = [t for t, m in zip(output.response_ids, output.response_mask) if m == 0]
    assert count(context_ids, processor.video_token_id) == 8  # 4 frames: a (2, 4, 4) grid, 2 x 2 x 2 merged
    assert count(context_ids, processor.image_token_id) == 4  # the still, before the video
    model_ids = [t for t, m in zip(output.response_ids, output.response_mask) if m == 1]
    assert count(model_ids, processor.video_token_id) == 0
    inputs = output.multi_modal_inputs
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]] and inputs["image_grid_thw"].tolist() == [[1, 4, 4]] * 2
    assert count(server.calls[1]["prompt_ids"], processor.video_token_id) == 8
    assert server.calls[1]["multi_modal_inputs"]["video_grid_thw"].tolist() == [[2, 4, 4]]
    time_scaled = "second_per_grid_ts" in inputs
    assert time_scaled == (processor.video_tokens_per_second is not None)  # Qwen2.5-VL: 2 frames at 1 fps, 2 s
    assert not time_scaled or inputs["second_per_grid_ts"].tolist() == [2.0]


def test_a_trajectory_with_a_tool_video_trains_like_a_plain_transformers_forward(vlm, make_context):
    path, processor = vlm
    server = ScriptedServer(processor.tokenizer, replay_script)
    context = make_context(server, tools=[ReplayTool()], processor=processor, response_length=120)
    outputs = [run_episode(context, seed) for seed in range(2)]
    config = RolloutConfig(prompt_length=48, response_length=120)
    data = AgentLoopManager(config, processor.tokenizer, [server], processor=processor).to_dataproto(outputs)
    assert data.batch[F.POSITION_IDS].shape == (2, 3, 48 + 120)
    torch.testing.assert_close(
        actor_log_probs(path, data), plain_transformers_log_probs(path, data), rtol=1e-4, atol=1e-4
    )
