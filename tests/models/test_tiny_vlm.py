"""The tiny VLM kit builds a Qwen2-VL folder whose model, tokenizer and processor load offline and agree."""

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoTokenizer

from hyflow.models.processor import is_multimodal_folder, load_processor
from hyflow.models.tiny_vlm import IMAGE_PAD, build_tiny_vlm


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


def _image_prompt(processor, text="How many circles?"):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_tiny_vlm_processor_expands_one_image_pad_per_merged_patch(vlm_path):
    processor = load_processor(vlm_path)
    image = Image.new("RGB", (84, 56), (255, 255, 255))  # 56x84 pixels: (2x3) merged patches of 28x28
    inputs = processor(text=[_image_prompt(processor)], images=[image], return_tensors="pt")
    pad_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 6]]
    assert int((inputs["input_ids"] == pad_id).sum()) == 6


def test_tiny_vlm_folder_loads_with_from_pretrained_and_runs_a_forward_on_an_image(vlm_path):
    assert is_multimodal_folder(vlm_path)
    model = AutoModelForImageTextToText.from_pretrained(vlm_path)
    processor = load_processor(vlm_path)
    inputs = processor(text=[_image_prompt(processor)], images=[Image.new("RGB", (56, 56))], return_tensors="pt")
    logits = model(**inputs).logits
    assert logits.shape[:2] == inputs["input_ids"].shape and torch.isfinite(logits).all()
    assert AutoTokenizer.from_pretrained(vlm_path).convert_tokens_to_ids(IMAGE_PAD) == model.config.image_token_id


def test_tiny_vlm_is_seeded(tmp_path):
    first = AutoModelForImageTextToText.from_pretrained(build_tiny_vlm(tmp_path / "a", seed=3))
    second = AutoModelForImageTextToText.from_pretrained(build_tiny_vlm(tmp_path / "b", seed=3))
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name


def test_load_processor_returns_none_for_a_text_only_folder(tmp_path):
    from hyflow.models.tiny import build_tiny_model

    assert load_processor(build_tiny_model(tmp_path / "text")) is None
