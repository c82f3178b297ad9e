"""SFT on image rows: the dataset expands image tokens like the RL dataset, the loss falls, the folder loads."""

import pytest
import torch
from transformers import AutoModelForImageTextToText

from hyflow import fields as F
from hyflow.config.data import DataConfig
from hyflow.config.sft import SFTDataConfig, load_sft_config
from hyflow.data.dataset import RLHFDataset
from hyflow.data.prepare import prepare_task
from hyflow.data.sft_dataset import LOSS_MASK, SFTDataset
from hyflow.models.processor import load_processor
from hyflow.models.tiny_vlm import build_tiny_vlm
from hyflow.trainer.sft_trainer import HF_DIR, SFTTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft-images")
    data = prepare_task("shapes", root / "data", train_size=16, test_size=4, image_size=84)
    return {"model": build_tiny_vlm(root / "model"), **data}


def test_sft_rows_hold_the_rl_prompt_tokens_with_untrained_image_pads_then_the_trained_answer(assets):
    processor = load_processor(assets["model"])
    config = SFTDataConfig(response_key="extra_info.answer", max_length=128)
    item = SFTDataset(assets["test"], processor.tokenizer, config, processor=processor)[0]
    prompt_ids = RLHFDataset(assets["test"], processor.tokenizer, DataConfig(), processor).prompt_ids[0]
    assert item[F.INPUT_IDS][: len(prompt_ids)].tolist() == prompt_ids
    assert item[LOSS_MASK][: len(prompt_ids)].sum() == 0 and item[LOSS_MASK][len(prompt_ids) :].sum() > 0
    image_pads = item[F.INPUT_IDS] == processor.image_token_id
    assert int(image_pads.sum()) == int(item[F.MULTI_MODAL_INPUTS]["image_grid_thw"].prod() // 4)
    assert item[F.POSITION_IDS].shape == (3, item[F.INPUT_IDS].numel())


def test_sft_on_image_rows_lowers_the_loss_and_saves_a_folder_with_its_processor(assets, tmp_path):
    overrides = [
        f"data.train_files={assets['train']}",
        "data.response_key=extra_info.answer",
        "data.train_batch_size=8",
        "data.micro_batch_size_per_gpu=3",
        "data.max_length=96",
        f"model.path={assets['model']}",
        "optim.lr=1e-2",
        "optim.weight_decay=0.0",
        "trainer.total_training_steps=6",
        "trainer.logger=[]",
        "trainer.save_freq=0",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={tmp_path}",
    ]
    history = SFTTrainer(load_sft_config(overrides)).fit()
    losses = [step["train/loss"] for step in history]
    assert losses[-1] < 0.7 * losses[0], losses
    folder = tmp_path / HF_DIR
    model = AutoModelForImageTextToText.from_pretrained(folder)
    assert torch.isfinite(model.model.visual.merger.mlp[0].weight).all()
    assert load_processor(folder).image_token_id == model.config.image_token_id


def test_sft_rows_with_a_video_expand_its_pads_untrained_beside_the_rl_prompt_tokens(assets, tmp_path):
    import io

    from PIL import Image

    from hyflow.data.prepare import write_parquet

    def png(colour):
        buffer = io.BytesIO()
        Image.new("RGB", (56, 56), colour).save(buffer, format="PNG")
        return {"bytes": buffer.getvalue(), "path": None}

    row = {
        "data_source": "clips",
        "prompt": [{"role": "user", "content": "<video>Which colour comes last?"}],
        "videos": [[png(c) for c in ("red", "green", "blue")]],
        "reward_model": {"style": "rule", "ground_truth": "blue"},
        "extra_info": {"answer": "blue"},
    }
    path = str(tmp_path / "clips.parquet")
    write_parquet([row], path)
    processor = load_processor(assets["model"])
    config = SFTDataConfig(response_key="extra_info.answer", max_length=128)
    item = SFTDataset(path, processor.tokenizer, config, processor=processor)[0]
    prompt_ids = RLHFDataset(path, processor.tokenizer, DataConfig(), processor).prompt_ids[0]
    assert item[F.INPUT_IDS][: len(prompt_ids)].tolist() == prompt_ids
    video_pads = item[F.INPUT_IDS] == processor.video_token_id
    assert int(video_pads.sum()) == 8 and item[LOSS_MASK][video_pads].sum() == 0  # 3 frames -> a (2, 4, 4) grid
    assert item[F.MULTI_MODAL_INPUTS]["video_grid_thw"].tolist() == [[2, 4, 4]]
