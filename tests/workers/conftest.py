"""Fixtures for the training-engine tests: one tiny model folder per session and synthetic PPO batches."""

import numpy as np
import pytest
import torch

from hyflow import fields as F
from hyflow.models.tiny import build_tiny_model
from hyflow.protocol import DataProto

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
