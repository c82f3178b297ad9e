"""Test kit for the rollout tests: prompts left-padded into a `DataProto` as the trainer hands them to the rollout
(the engine's tiny models and references come from `tests/engine/engine_testkit.py`)."""

from __future__ import annotations

import torch

from hyflow import fields as F
from hyflow.protocol import DataProto

PAD = 0


def prompt_batch(prompts: list[list[int]], **meta) -> DataProto:
    """Prompts left-padded with PAD into a DataProto (input_ids, attention_mask, position_ids), as the trainer
    hands them to the rollout; `meta` becomes its meta_info."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict({F.INPUT_IDS: ids, F.ATTENTION_MASK: mask, F.POSITION_IDS: positions}, meta_info=meta)
