"""`hyflow prepare-data shapes|geo3k`: multimodal splits that RLHFDataset with a processor reads back."""

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from hyflow import fields as F
from hyflow.cli import main as hyflow_main
from hyflow.config.data import DataConfig
from hyflow.data.dataset import RLHFDataset
from hyflow.data.prepare import prepare_task
from hyflow.data.preprocess.shapes import COLORS, make_rows
from hyflow.models.processor import load_processor
from hyflow.models.tiny_vlm import build_tiny_vlm


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    return load_processor(build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm")))


def _non_white_pixels(png: bytes) -> set:
    image = Image.open(io.BytesIO(png)).convert("RGB")
    return {color for _, color in image.getcolors()} - {(255, 255, 255)}


def test_shapes_rows_are_seeded_and_their_pictures_show_the_answer():
    rows = make_rows(20, seed=5, question="color")
    assert [r["images"][0]["bytes"] for r in rows] == [r["images"][0]["bytes"] for r in make_rows(20, seed=5)]
    for row in rows:
        color = COLORS[row["reward_model"]["ground_truth"]]
        assert _non_white_pixels(row["images"][0]["bytes"]) == {color}
        assert row["prompt"][0]["content"].startswith("<image>What color")


def test_shapes_count_questions_span_one_to_max_count():
    answers = {row["reward_model"]["ground_truth"] for row in make_rows(40, seed=0, question="count", max_count=3)}
    assert answers == {"1", "2", "3"}


def test_prepare_data_shapes_writes_splits_the_multimodal_dataset_reads(tmp_path, processor):
    sizes = ["--train-size", "6", "--test-size", "2", "--output", str(tmp_path)]
    assert hyflow_main(["prepare-data", "shapes", *sizes, "--question", "count", "--image-size", "56"]) == 0
    dataset = RLHFDataset(str(tmp_path / "train.parquet"), processor.tokenizer, DataConfig(), processor=processor)
    assert len(dataset) == 6
    assert dataset[0][F.MULTI_MODAL_INPUTS]["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_bad_shapes_options_name_the_rule():
    with pytest.raises(ValueError, match="image_size=50 must be a multiple of 28"):
        make_rows(1, seed=0, image_size=50)


def test_geo3k_keeps_images_and_adds_verls_instruction(tmp_path, processor):
    raw = tmp_path / "raw"
    raw.mkdir()
    buffer = io.BytesIO()
    Image.new("RGB", (60, 40), (0, 0, 0)).save(buffer, format="PNG")
    record = {"images": [{"bytes": buffer.getvalue(), "path": "fig.png"}], "problem": "<image>Find x.", "answer": "3"}
    for split in ("train", "test"):
        pq.write_table(pa.Table.from_pylist([record, record]), raw / f"{split}-00000.parquet")
    written = prepare_task("geo3k", tmp_path / "out", raw)
    dataset = RLHFDataset(written["test"], processor.tokenizer, DataConfig(max_prompt_length=256), processor=processor)
    row = dataset.rows[0]
    assert row["data_source"] == "hiyouga/geometry3k" and row["reward_model"]["ground_truth"] == "3"
    assert row["prompt"][0]["content"].startswith("<image>Find x. You FIRST think about the reasoning process")
    assert dataset[0][F.MULTI_MODAL_DATA]["image"][0].size == (60, 40)
