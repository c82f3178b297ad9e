"""Images and videos in agent conversations: the prompt through the processor, tool images as new image inputs.

An episode of a vision-language model keeps, beside its token list, the pictures its pad tokens stand for:

    AgentData.image_data          PIL images, in the order their pad blocks appear in prompt_ids + response_ids
    AgentData.video_data          videos (`hyflow.data.video.Video`: frames and frame rate), likewise
    AgentData.multi_modal_inputs  the processor's outputs for all of them (pixel_values, image_grid_thw,
                                  pixel_values_videos, video_grid_thw, second_per_grid_ts), rows in that same order

The prompt's images come from the row's `multi_modal_data` (the dataset decoded them); `encode_prompt_with_images`
renders the chat template over the messages with "<image>" / "<video>" turned into content parts and expands each
pad token as the processor does. A tool that returns images (`ToolResponse.image`) or videos (`ToolResponse.video`)
gets a tool message whose content is one image part per image, one video part per video and then its text;
`expand_tool_images` expands those pad tokens in the message's token delta and returns their processor outputs,
which `AgentData.add_images` appends, so every later turn's generation request and the trajectory's training
forward see the whole multi-image sequence. The delta keeps response_mask 0: the pads are context, never trained
on.
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from hyflow.agent.chat import render
from hyflow.data.images import decode_image
from hyflow.data.multimodal import expand_vision_pads, image_features, process_prompt, to_content_parts
from hyflow.data.schema import RowError
from hyflow.data.video import Video, decode_video, video_features

__all__ = [
    "encode_prompt_with_images", "expand_tool_images", "merge_inputs", "tool_images", "tool_message", "tool_videos",
]  # fmt: skip


def encode_prompt_with_images(
    processor: Any,
    messages: list[dict[str, Any]],
    images: list[Image.Image],
    videos: list[Video],
    tools: list[dict] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[int], dict[str, torch.Tensor]]:
    """(prompt ids with the pads expanded, multi_modal_inputs) of a prompt whose text holds one "<image>" per image
    and one "<video>" per video (verl's schema), with the generation prompt and the tools' schemas."""
    error = RowError("agent loop", 0)
    parts = to_content_parts(messages, len(images), error, "raw_prompt", len(videos))
    text = render(processor.tokenizer, parts, tools, True, template_kwargs)
    return process_prompt(processor, text, images, videos)


def tool_images(items: list[Any] | None, tool_name: str) -> list[Image.Image]:
    """A tool's returned images as RGB PIL images (each a PIL image, `{"bytes", "path"}` or a file path)."""
    error = RowError(f"tool {tool_name}", 0)
    return [decode_image(item, error, "ToolResponse.image", i) for i, item in enumerate(items or [])]


def tool_videos(items: list[Any] | None, tool_name: str) -> list[Video]:
    """A tool's returned videos, each decoded like a row's (frames, a video file, verl's {"video", "fps"}, or a
    `Video`)."""
    error = RowError(f"tool {tool_name}", 0)
    videos = []
    for i, item in enumerate(items or []):
        videos.append(item if isinstance(item, Video) else decode_video(item, error, "ToolResponse.video", i))
    return videos


def tool_message(text: str, num_images: int, num_videos: int = 0) -> dict[str, Any]:
    """The conversation's message for one tool response: its images first, then its videos, then its text."""
    if not num_images and not num_videos:
        return {"role": "tool", "content": text}
    parts: list[dict[str, Any]] = [{"type": "image"} for _ in range(num_images)]
    parts += [{"type": "video"} for _ in range(num_videos)]
    return {"role": "tool", "content": [*parts, {"type": "text", "text": text}]}


def expand_tool_images(
    processor: Any, delta_ids: list[int], images: list[Image.Image], videos: list[Video] | None = None
) -> tuple[list[int], dict[str, torch.Tensor]]:
    """The token delta of new tool messages with each image's (video's) single pad token expanded, and their
    processor outputs (pixel_values, image_grid_thw; pixel_values_videos, video_grid_thw, ...)."""
    videos = videos or []
    inputs = {**image_features(processor, images), **video_features(processor, videos)}
    ids, _ = expand_vision_pads(processor, delta_ids, [0] * len(delta_ids), inputs)
    for kind, pad_id, count in (("image", processor.image_token_id, len(images)),
                                ("video", getattr(processor, "video_token_id", None), len(videos))):  # fmt: skip
        num_pads = sum(token == pad_id for token in delta_ids)
        if num_pads != count:
            raise ValueError(
                f"the chat template rendered {num_pads} {kind} pad token(s) for {count} tool {kind}(s); use a "
                f"template that renders {{'type': '{kind}'}} parts of tool messages (Qwen2-VL's does)."
            )
    return ids, inputs


def merge_inputs(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Processor outputs of two groups of images / videos, `old` first: each key's rows concatenated."""
    merged = dict(old)
    for key, value in new.items():
        merged[key] = torch.cat([merged[key], value]) if key in merged else value
    return merged
