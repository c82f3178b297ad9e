"""Fixtures for reward tests: the tiny tokenizer and a builder of scored-batch DataProtos."""

import numpy as np
import pytest
import torch

from hyflow.models.tiny import build_tiny_tokenizer
from hyflow.protocol import DataProto


@pytest.fixture(scope="session")
def tokenizer():
    return build_tiny_tokenizer()


def build_batch(tokenizer, responses, ground_truths, data_sources, prompt_len=8, response_len=24, styles=None):
    """A DataProto like the rollout's output: left-padded prompts, right-padded responses (+ eos), schema fields."""
    num_rows = len(responses)
    pad = tokenizer.pad_token_id
    prompts = torch.full((num_rows, prompt_len), pad, dtype=torch.long)
    response_ids = torch.full((num_rows, response_len), pad, dtype=torch.long)
    attention = torch.zeros(num_rows, prompt_len + response_len, dtype=torch.long)
    for i, text in enumerate(responses):
        prompt = tokenizer("Compute 1 + 2.", add_special_tokens=False)["input_ids"][-prompt_len:]
        prompts[i, prompt_len - len(prompt) :] = torch.tensor(prompt)
        ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])[:response_len]
        response_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, prompt_len - len(prompt) : prompt_len + len(ids)] = 1
    styles = styles or ["rule"] * num_rows
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": response_ids,
            "input_ids": torch.cat([prompts, response_ids], dim=1),
            "attention_mask": attention,
            "response_mask": attention[:, prompt_len:].clone(),
        },
        non_tensors={
            "data_source": np.array(data_sources, dtype=object),
            "reward_model": [{"style": s, "ground_truth": t} for s, t in zip(styles, ground_truths)],
            "extra_info": [{"index": i} for i in range(num_rows)],
        },
    )


@pytest.fixture
def make_batch(tokenizer):
    def make(responses, ground_truths, data_sources, **kwargs):
        return build_batch(tokenizer, responses, ground_truths, data_sources, **kwargs)

    return make
