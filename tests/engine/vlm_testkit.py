"""Test kit for the engine's image prompts: the tiny Qwen2-VL / Qwen2.5-VL (built locally, peaked random weights),
image prompts through its processor, and the transformers references (full-forward logits, greedy generate)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from hyflow.engine.config import EngineConfig
from hyflow.engine.engine import LLMEngine
from hyflow.models.processor import load_processor
from hyflow.models.tiny import peak_weights
from hyflow.models.tiny_vlm import build_tiny_vlm


def make_tiny_vlm(folder, arch: str = "qwen2_vl", seed: int = 0) -> tuple[torch.nn.Module, object, str]:
    """(fp32 eval transformers model with peaked random weights, processor, folder) of a tiny VLM."""
    path = build_tiny_vlm(folder, arch=arch, seed=seed)
    model = peak_weights(AutoModelForImageTextToText.from_pretrained(path).eval(), seed)
    return model, load_processor(path), path


def random_image(seed: int, size: tuple[int, int] = (84, 56)) -> Image.Image:
    """A noise picture of `size` (width, height); 84 x 56 pixels is 6 tokens of the tiny VLM."""
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def image_prompt(processor, images: list[Image.Image], text: str = "What is in the picture?") -> dict:
    """The processor's outputs for a one-turn chat prompt with `images` before `text` (input_ids (1, P), ...)."""
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    chat = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return processor(text=[chat], images=images or None, return_tensors="pt")


def video_prompt(processor, frames: list[Image.Image], fps: float = 2.0, image: Image.Image | None = None) -> dict:
    """transformers' inputs for a one-turn chat prompt with (an image and) a video of `frames` at `fps` before the
    question, through hyflow's video path (the tiny processor has no video processor): input_ids (1, P),
    pixel_values_videos, video_grid_thw (for Qwen2.5-VL second_per_grid_ts), mm_token_type_ids."""
    from hyflow.data.multimodal import process_prompt
    from hyflow.data.video import Video

    content = [{"type": "image"}] if image is not None else []
    content += [{"type": "video"}, {"type": "text", "text": "What happens?"}]
    chat = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    ids, inputs = process_prompt(processor, chat, [image] if image is not None else [], [Video(frames, fps)])
    input_ids = torch.tensor([ids])
    types = (input_ids == processor.image_token_id).long() + 2 * (input_ids == processor.video_token_id).long()
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "mm_token_type_ids": types, **inputs}


def vision_engine_inputs(inputs: dict) -> tuple[list[int], dict[str, torch.Tensor]]:
    """(prompt ids, multi_modal_inputs) of a processed prompt with images and/or videos, as the engine takes them."""
    keys = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
    return inputs["input_ids"][0].tolist(), {key: inputs[key] for key in keys if key in inputs}


def engine_inputs(inputs: dict) -> tuple[list[int], dict[str, torch.Tensor]]:
    """(prompt ids, multi_modal_inputs) of one processed prompt, as the engine takes them."""
    return inputs["input_ids"][0].tolist(), {key: inputs[key] for key in ("pixel_values", "image_grid_thw")}


def hf_logits(model, inputs: dict, continuation: list[int]) -> torch.Tensor:
    """transformers' next-token logits (len(continuation) + 1, V) after the prompt and each continuation token."""
    ids = torch.cat([inputs["input_ids"], torch.tensor([continuation], dtype=torch.long)], dim=1)
    token_types = torch.zeros_like(ids)
    token_types[:, : inputs["input_ids"].shape[1]] = inputs["mm_token_type_ids"]
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=inputs["pixel_values"],
            image_grid_thw=inputs["image_grid_thw"],
            mm_token_type_ids=token_types,
        ).logits[0]
    return logits[inputs["input_ids"].shape[1] - 1 :]


def hf_greedy(model, inputs: dict, max_new_tokens: int) -> list[int]:
    """Greedy continuation of one image prompt by `transformers.generate`."""
    out = model.generate(
        **inputs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None
    )
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def make_engine(model, num_scheduler_steps: int = 8, **overrides) -> LLMEngine:
    config = dict(block_size=8, num_kv_blocks=96, max_model_len=128, device="cpu", dtype="float32")
    config.update(overrides)
    return LLMEngine(model, EngineConfig(num_scheduler_steps=num_scheduler_steps, **config))


def recording_logits(engine: LLMEngine) -> list[torch.Tensor]:
    """Makes the engine's runner record the logits (B, V) of every forward step, in order; returns the list."""
    recorded: list[torch.Tensor] = []
    forward = engine.runner.forward

    def record(*args, **kwargs):
        logits = forward(*args, **kwargs)
        recorded.append(logits.clone())
        return logits

    engine.runner.forward = record
    return recorded
