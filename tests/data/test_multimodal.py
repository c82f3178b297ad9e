"""RLHFDataset with a processor: images in verl's schema become multimodal inputs, M-RoPE positions and errors."""

import io

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from hyflow import fields as F
from hyflow.config.data import DataConfig
from hyflow.data.dataset import RLHFDataset
from hyflow.models.processor import load_processor
from hyflow.models.tiny_vlm import IMAGE_PAD, build_tiny_vlm


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="module")
def processor(vlm_path):
    return load_processor(vlm_path)


def png_bytes(width=56, height=56, color=(200, 30, 30)):
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


def image_row(content="<image>How many circles?", images=None):
    return {
        "data_source": "shapes",
        "prompt": [{"role": "user", "content": content}],
        "images": [{"bytes": png_bytes(), "path": None}] if images is None else images,
        "reward_model": {"style": "rule", "ground_truth": "3"},
    }


def dataset(path, processor, **overrides):
    config = DataConfig(max_prompt_length=overrides.pop("max_prompt_length", 64), **overrides)
    return RLHFDataset(path, processor.tokenizer, config, processor=processor)


def test_an_image_row_gives_pixel_values_grid_and_one_pad_per_merged_patch(write_rows, processor):
    wide = [{"bytes": png_bytes(84, 56), "path": None}]
    item = dataset(write_rows([image_row(images=wide)]), processor)[0]
    inputs = item[F.MULTI_MODAL_INPUTS]
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 6]]
    assert inputs["pixel_values"].shape[0] == 24
    pad_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert int((item[F.INPUT_IDS] == pad_id).sum()) == 6
    assert item[F.MULTI_MODAL_DATA]["image"][0].size == (84, 56)


def test_position_ids_are_the_models_mrope_rows_for_a_left_padded_row(write_rows, processor, vlm_path):
    item = dataset(write_rows([image_row(images=[{"bytes": png_bytes(84, 56)}])]), processor)[0]
    model = AutoModelForImageTextToText.from_pretrained(vlm_path)
    input_ids, mask = item[F.INPUT_IDS][None], item[F.ATTENTION_MASK][None]
    mm_token_type_ids = (input_ids == model.config.image_token_id).long()
    expected, _ = model.model.get_rope_index(
        input_ids, mm_token_type_ids, item[F.MULTI_MODAL_INPUTS]["image_grid_thw"], attention_mask=mask
    )
    assert item[F.POSITION_IDS].shape == (3, 64)
    assert torch.equal(item[F.POSITION_IDS], expected[:, 0])


def test_images_can_be_file_paths(write_rows, processor, tmp_path):
    path = tmp_path / "red.png"
    path.write_bytes(png_bytes())
    row = image_row(images=[str(path)])
    assert dataset(write_rows([row]), processor)[0][F.MULTI_MODAL_INPUTS]["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_undecodable_image_bytes_fail_at_load_naming_file_row_and_column(write_rows, processor):
    path = write_rows([image_row(), image_row(images=[{"bytes": b"not an image", "path": None}])])
    with pytest.raises(ValueError, match=r"data\.parquet.*row 1, column 'images': image 0 cannot be decoded"):
        dataset(path, processor)


def test_a_missing_image_file_fails_at_load_naming_the_file(write_rows, processor):
    with pytest.raises(ValueError, match=r"row 0, column 'images': image 0: the file '/no/such.png' does not exist"):
        dataset(write_rows([image_row(images=["/no/such.png"])]), processor)


def test_a_placeholder_count_that_differs_from_the_images_fails_at_load(write_rows, processor):
    row = image_row(content="<image><image>Compare.")
    with pytest.raises(ValueError, match=r"row 0, column 'prompt': the prompt has 2 '<image>' .* 1 image"):
        dataset(write_rows([row]), processor)


def test_overlong_filtering_counts_image_tokens(write_rows, processor):
    big = [{"bytes": png_bytes(112, 112), "path": None}]  # 16 image tokens instead of 4: 44 tokens, not 32
    rows = [image_row(), image_row(images=big)]
    kept = dataset(write_rows(rows), processor, max_prompt_length=40, filter_overlong_prompts=True)
    assert len(kept) == 1
    assert kept[0][F.MULTI_MODAL_INPUTS]["image_grid_thw"].tolist() == [[1, 4, 4]]
