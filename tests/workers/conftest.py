"""Fixtures for the training-engine tests: one tiny model folder per session and synthetic PPO batches."""

import numpy as np
import pytest
import torch

from hyflow import fields as F
from hyflow.config.data import DataConfig
from hyflow.data.collate import collate_fn
from hyflow.data.dataset import RLHFDataset
from hyflow.data.prepare import prepare_task
from hyflow.models.processor import load_processor
from hyflow.models.tiny import build_tiny_model
from hyflow.models.tiny_vlm import build_tiny_vlm
from hyflow.protocol import DataProto
from hyflow.rollout.batch import pack_responses

VOCAB = 500  # token ids drawn below the tiny tokenizer's size


def make_ppo_batch(batch_size: int = 8, prompt_length: int = 6, response_length: int = 5, seed: int = 0) -> DataProto:
    """Left-padded prompts, right-padded responses, random advantages: everything an actor update reads."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, VOCAB, (batch_size, prompt_length), generator=g)
    responses = torch.randint(3, VOCAB, (batch_size, response_length), generator=g)
    prompt_lens = torch.randint(1, prompt_length + 1, (batch_size,), generator=g)
    response_lens = torch.randint(1, response_length + 1, (batch_size,), generator=g)
    prompt_mask = (torch.arange(prompt_length) >= prompt_length - prompt_lens[:, None]).long()
    response_mask = (torch.arange(response_length) < response_lens[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    tensors = {
        F.PROMPTS: prompts,
        F.RESPONSES: responses,
        F.INPUT_IDS: torch.cat([prompts, responses], dim=1) * attention_mask,
        F.ATTENTION_MASK: attention_mask,
        F.POSITION_IDS: position_ids,
        F.RESPONSE_MASK: response_mask,
        F.OLD_LOG_PROBS: -torch.rand(batch_size, response_length, generator=g) * 5,
        F.REF_LOG_PROB: -torch.rand(batch_size, response_length, generator=g) * 5,
        F.ADVANTAGES: torch.randn(batch_size, response_length, generator=g),
        F.VALUES: torch.randn(batch_size, response_length, generator=g),
        F.RETURNS: torch.randn(batch_size, response_length, generator=g),
    }
    uids = np.array([f"u{i // 2}" for i in range(batch_size)], dtype=object)
    return DataProto.from_dict(tensors, {F.UID: uids})


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen2", arch="qwen2", hidden_size=32, num_layers=2)


@pytest.fixture
def ppo_batch():
    """The `make_ppo_batch` factory, for tests to call with their own sizes and seeds."""
    return make_ppo_batch


IMAGE_RESPONSE_LENGTH = 5


@pytest.fixture(scope="session")
def vlm_path(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="session")
def image_batch(vlm_path, tmp_path_factory):
    """6 rows of the shapes task (84x84 pictures: 9 image tokens each) with random responses of random lengths,
    in the layout the rollout hands the actor and critic (M-RoPE positions, per-row multi_modal_inputs)."""
    folder = tmp_path_factory.mktemp("shapes")
    written = prepare_task("shapes", folder, train_size=6, test_size=1, image_size=84, max_count=3)
    processor = load_processor(vlm_path)
    dataset = RLHFDataset(written["train"], processor.tokenizer, DataConfig(max_prompt_length=64), processor)
    prompts = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    generator = torch.Generator().manual_seed(0)
    responses = [torch.randint(3, 300, (int(n),), generator=generator).tolist() for n in [5, 2, 4, 1, 5, 3]]
    data = pack_responses(
        prompts, responses, [[0.0] * len(r) for r in responses], ["stop"] * 6, IMAGE_RESPONSE_LENGTH, 0
    )
    data.batch[F.ADVANTAGES] = torch.randn(6, IMAGE_RESPONSE_LENGTH, generator=generator)
    return data


def _png(color, size=(56, 56)):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def _video_batch(model_path, folder):
    """4 rows: a 4-frame video, a 3-frame video with an image, a 2-frame video at 1 fps, text only; random
    responses, in the layout the rollout hands the actor (M-RoPE positions, per-row multi_modal_inputs with video
    inputs, through the processor of `model_path`)."""
    from hyflow.data.prepare import write_parquet

    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (250, 250, 0)]
    contents = [
        ("<video>What moves?", 4, 0, 2.0),
        ("<image>and<video>?", 3, 1, 2.0),
        ("<video>Which colour?", 2, 0, 1.0),
        ("Hi", 0, 0, 2.0),
    ]
    rows = []
    for content, num_frames, num_images, fps in contents:
        rows.append({
            "data_source": "clips",
            "prompt": [{"role": "user", "content": content}],
            "videos": [{"video": [_png(c) for c in colors[:num_frames]], "fps": fps}] if num_frames else [],
            "images": [_png(colors[3], (84, 56))] * num_images,
            "reward_model": {"style": "rule", "ground_truth": "red"},
        })  # fmt: skip
    path = str(folder / "clips.parquet")
    write_parquet(rows, path)
    processor = load_processor(model_path)
    dataset = RLHFDataset(path, processor.tokenizer, DataConfig(max_prompt_length=64), processor)
    prompts = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    generator = torch.Generator().manual_seed(1)
    responses = [torch.randint(3, 300, (int(n),), generator=generator).tolist() for n in [5, 3, 1, 4]]
    data = pack_responses(
        prompts, responses, [[0.0] * len(r) for r in responses], ["stop"] * 4, IMAGE_RESPONSE_LENGTH, 0
    )
    data.batch[F.ADVANTAGES] = torch.randn(4, IMAGE_RESPONSE_LENGTH, generator=generator)
    return data


@pytest.fixture(scope="session")
def video_batch(vlm_path, tmp_path_factory):
    """`_video_batch` of the tiny Qwen2-VL."""
    return _video_batch(vlm_path, tmp_path_factory.mktemp("clips"))


@pytest.fixture(scope="session")
def qwen25_vlm_path(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-qwen2.5-vl"), arch="qwen2_5_vl")


@pytest.fixture(scope="session")
def qwen25_video_batch(qwen25_vlm_path, tmp_path_factory):
    """`_video_batch` of the tiny Qwen2.5-VL: its rows carry second_per_grid_ts, its positions are time-scaled."""
    return _video_batch(qwen25_vlm_path, tmp_path_factory.mktemp("clips-qwen2.5"))
