"""The tiny vision-language kit: a small Qwen2-VL (random, seeded weights) and its processor, saved to a folder.

Tests and `hyflow demo --task vision` use it so that nothing is downloaded:

    from hyflow.models.tiny_vlm import build_tiny_vlm
    path = build_tiny_vlm("/tmp/tiny-qwen2-vl")                       # model + tokenizer + image processor
    model = AutoModelForImageTextToText.from_pretrained(path)
    processor = load_processor(path)                                    # Qwen2VLProcessor, PIL image backend

The tokenizer is `hyflow.models.tiny`'s byte-level BPE plus Qwen2-VL's vision tokens (`<|vision_start|>`,
`<|image_pad|>`, `<|video_pad|>`, `<|vision_end|>`); the chat template renders `{"type": "image"}` content parts
as `<|vision_start|><|image_pad|><|vision_end|>`, which the processor expands to one pad per merged patch. The
image processor is the Pillow one (no torchvision needed); images of 28*28 pixels per token, so a 56x56 image is
4 tokens and the default `max_pixels` keeps prompts short on a CPU.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, GenerationConfig, PreTrainedTokenizerFast
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from hyflow.models.processor import image_text_processor_class, save_processor
from hyflow.models.tiny import IM_END, PAD, build_tiny_tokenizer, save_tokenizer

logger = logging.getLogger(__name__)

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
PATCH_SIZE, MERGE_SIZE = 14, 2  # Qwen2-VL's: one language-model token per 28x28 pixels
DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS = 28 * 28, 28 * 28 * 16  # 1 to 16 tokens per image

# ChatML where a message's content is a string or a list of parts ({"type": "text"|"image"|"video", ...}), as
# Qwen2-VL's own template renders them (written for hyflow).
VLM_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' or 'video' in part %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tiny_vlm_tokenizer() -> PreTrainedTokenizerFast:
    """`build_tiny_tokenizer()` with Qwen2-VL's vision special tokens and the multimodal chat template."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens(VISION_TOKENS, special_tokens=True)
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    return tokenizer


def build_tiny_processor(
    tokenizer: PreTrainedTokenizerFast | None = None,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Any:
    """A Qwen2-VL processor (Pillow image backend, no video processor) over the tiny tokenizer."""
    tokenizer = tokenizer if tokenizer is not None else build_tiny_vlm_tokenizer()
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=min_pixels, max_pixels=max_pixels, patch_size=PATCH_SIZE, merge_size=MERGE_SIZE
    )
    return image_text_processor_class()(image_processor, tokenizer, chat_template=VLM_CHAT_TEMPLATE)


ARCHS = ("qwen2_vl", "qwen2_5_vl")


def _vision_config(arch: str, hidden_size: int) -> dict:
    """A one-block vision tower whose merger projects into the language model's `hidden_size`."""
    shared = {"depth": 1, "num_heads": 2, "patch_size": PATCH_SIZE, "spatial_merge_size": MERGE_SIZE}
    if arch == "qwen2_vl":
        return {**shared, "embed_dim": 32, "hidden_size": hidden_size, "mlp_ratio": 2, "temporal_patch_size": 2}
    # Qwen2.5-VL: windowed attention over 56-pixel windows, the (only) block attends fully
    return {**shared, "hidden_size": 32, "intermediate_size": 64, "out_hidden_size": hidden_size, "window_size": 56,
            "fullatt_block_indexes": [0], "temporal_patch_size": 2}  # fmt: skip


def tiny_vlm_config(
    tokenizer: PreTrainedTokenizerFast, hidden_size: int = 64, num_layers: int = 2, arch: str = "qwen2_vl"
) -> Any:
    """A Qwen2-VL (or Qwen2.5-VL) config of ~200k parameters whose special-token ids are the tiny tokenizer's."""
    if arch not in ARCHS:
        raise ValueError(f"build_tiny_vlm: arch={arch!r} is not supported; use one of {list(ARCHS)}.")
    num_heads = 4
    head_dim = hidden_size // num_heads
    quarter = head_dim // 2 // 4  # M-RoPE splits head_dim/2 frequencies into (temporal, height, width) sections
    ids = tokenizer.convert_tokens_to_ids
    text_config = {
        "vocab_size": ((len(tokenizer) + 63) // 64) * 64,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [head_dim // 2 - 2 * quarter, quarter, quarter],
        },
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": ids(IM_END),
        "bos_token_id": None,
        "tie_word_embeddings": True,
    }
    return AutoConfig.for_model(
        arch,
        text_config=text_config,
        vision_config=_vision_config(arch, hidden_size),
        image_token_id=ids(IMAGE_PAD),
        video_token_id=ids(VIDEO_PAD),
        vision_start_token_id=ids(VISION_START),
        vision_end_token_id=ids(VISION_END),
        tie_word_embeddings=True,
    )


def build_tiny_vlm(
    path: str | os.PathLike,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    arch: str = "qwen2_vl",
) -> str:
    """Save a randomly initialised (seeded) tiny Qwen2-VL (`arch="qwen2_5_vl"`: Qwen2.5-VL), its tokenizer and its
    processor to `path`; return it.

    `AutoModelForImageTextToText.from_pretrained(path)`, `hyflow.models.processor.load_processor(path)` (or
    `AutoProcessor.from_pretrained(path)` where torchvision is installed) and `AutoTokenizer` load it offline.
    """
    tokenizer = build_tiny_vlm_tokenizer()
    config = tiny_vlm_config(tokenizer, hidden_size=hidden_size, num_layers=num_layers, arch=arch)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
    eos_ids = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(PAD)]
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id)
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    save_processor(build_tiny_processor(tokenizer, min_pixels=min_pixels, max_pixels=max_pixels), path)
    save_tokenizer(tokenizer, path)
    num_params = sum(p.numel() for p in model.parameters())
    logger.info("built tiny %s (%d params) at %s", arch, num_params, path)
    return path
