"""Load a vision-language model's processor (image processor + tokenizer + chat template) from a local folder.

    processor = load_processor(model_path)          # None for a text-only model folder
    inputs = processor(text=[prompt], images=[image], return_tensors="pt")   # input_ids, pixel_values, image_grid_thw

`AutoProcessor` is used where it can be. transformers' video processors need torchvision, and without it
`Qwen2VLProcessor` cannot even be built (its constructor checks the video processor's class); for the Qwen2-VL
family hyflow then builds `image_text_processor_class()`, the same processor without videos, from the folder's image
processor, tokenizer and chat template, so image-only training runs on a plain CPU install.

For Qwen2.5-VL, whose M-RoPE spaces a video's temporal positions by time, `load_processor` records the model's
`vision_config.tokens_per_second` on the processor (`video_tokens_per_second(processor)`), so the data path computes
the positions the model does from the same object that makes the video inputs.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from functools import cache
from typing import Any

logger = logging.getLogger(__name__)

QWEN2_VL_FAMILY = ("qwen2_vl", "qwen2_5_vl")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


@cache
def image_text_processor_class() -> type:
    """`Qwen2VLProcessor` with images only (no video processor), for installs without torchvision. Built on first
    use: transformers' processing modules take seconds to import, which text-only runs should not pay."""
    from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor

    class ImageTextProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: str | None = None):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template)

    return ImageTextProcessor


def is_multimodal_folder(path: str | os.PathLike) -> bool:
    """Whether a model folder holds a processor (an image processor config beside the tokenizer)."""
    return any(os.path.isfile(os.path.join(path, name)) for name in PROCESSOR_FILES)


def save_processor(processor: Any, path: str | os.PathLike) -> None:
    """Save so that `AutoProcessor` (with torchvision) and `load_processor` (without) both load the folder."""
    processor.save_pretrained(path)
    config_file = os.path.join(path, "processor_config.json")
    with open(config_file) as f:
        config = json.load(f)
    if config.get("processor_class") == image_text_processor_class().__name__:
        config["processor_class"] = "Qwen2VLProcessor"
        with open(config_file, "w") as f:
            json.dump(config, f, indent=2)


def copy_processor_files(source: str | os.PathLike, destination: str | os.PathLike) -> list[str]:
    """Copy a model folder's processor files (image processor config, processor config, chat template) into
    `destination`, so a trained or merged folder loads with its processor; returns the names copied."""
    copied = []
    for name in (*PROCESSOR_FILES, "video_preprocessor_config.json", "chat_template.jinja", "chat_template.json"):
        if os.path.isfile(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), os.path.join(destination, name))
            copied.append(name)
    return copied


def _model_type(path: str) -> str | None:
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        return None
    with open(config_file) as f:
        return json.load(f).get("model_type")


TOKENS_PER_SECOND = "video_tokens_per_second"  # the attribute load_processor sets (not saved with the processor)


def video_tokens_per_second(processor: Any) -> float | None:
    """Temporal positions per second of video of the processor's model (Qwen2.5-VL's
    `vision_config.tokens_per_second`); None where video positions count temporal patches (Qwen2-VL) or the
    processor was not made by `load_processor`."""
    return getattr(processor, TOKENS_PER_SECOND, None)


def _tokens_per_second(path: str) -> float | None:
    """A Qwen2.5-VL folder's `vision_config.tokens_per_second` (transformers' default where the file has none)."""
    if _model_type(path) != "qwen2_5_vl":
        return None
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path).vision_config.tokens_per_second


def _chat_template(path: str) -> str | None:
    template_file = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(template_file):
        with open(template_file, encoding="utf-8") as f:
            return f.read()
    return None


def load_processor(
    path: str | os.PathLike,
    trust_remote_code: bool = False,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> Any | None:
    """The folder's processor, or None when it has none (a text-only model); `min_pixels` / `max_pixels` override
    the image processor's size limits (verl's `data.min_pixels` / `data.max_pixels`: pixels per image)."""
    path = os.path.expanduser(os.fspath(path))
    if not is_multimodal_folder(path):
        return None
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
    from transformers.utils import is_torchvision_available

    size_kwargs = {key: value for key, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if value}
    model_type = _model_type(path)
    has_video_processor = os.path.isfile(os.path.join(path, "video_preprocessor_config.json"))
    if model_type not in QWEN2_VL_FAMILY or (is_torchvision_available() and has_video_processor):
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code, **size_kwargs)
    else:
        # transformers' video processors need torchvision and their own config file; without either, the image
        # processor serves images (and hyflow's video frames, hyflow/data/video.py).
        logger.info("no torchvision or no video processor config: loading %s's image processor and tokenizer", path)
        image_processor = AutoImageProcessor.from_pretrained(path, **size_kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        processor = image_text_processor_class()(image_processor, tokenizer, chat_template=_chat_template(path))
    setattr(processor, TOKENS_PER_SECOND, _tokens_per_second(path))
    return processor
