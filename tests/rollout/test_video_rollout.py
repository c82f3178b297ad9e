"""Video prompts through the trainer's rollouts on a tiny Qwen2.5-VL: the engine rollout (its video prefill) and
the hf rollout (`transformers.generate` with `second_per_grid_ts`) give the same greedy tokens, clips at two frame
rates included, so both place the videos' time-scaled positions alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hyflow import fields as F
from hyflow.config.actor_rollout_ref import RolloutConfig
from hyflow.data.multimodal import row_position_ids
from hyflow.protocol import DataProto
from hyflow.rollout.worker_rollout import EngineRollout, build_rollout

from ..engine.vlm_testkit import make_tiny_vlm, random_image, video_prompt, vision_engine_inputs


def _video_batch(processor) -> DataProto:
    """Three left-padded video prompts as the dataset hands them to the rollout: a clip at 2 fps, the same clip at
    0.5 fps (4 s per temporal patch), and an image beside a 6-frame clip."""
    clip = [random_image(i, size=(56, 56)) for i in range(4)]
    rows = [
        video_prompt(processor, clip),
        video_prompt(processor, clip, fps=0.5),
        video_prompt(processor, [random_image(10 + i, size=(56, 56)) for i in range(6)], image=random_image(20)),
    ]
    prompts = [vision_engine_inputs(row) for row in rows]
    width = max(len(ids) for ids, _ in prompts)
    pad = processor.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in prompts])
    mask = (ids != pad).long()
    inputs = [row_inputs for _, row_inputs in prompts]
    positions = torch.stack([row_position_ids(processor, i, m, r) for i, m, r in zip(ids, mask, inputs)])
    tensors = {F.INPUT_IDS: ids, F.ATTENTION_MASK: mask, F.POSITION_IDS: positions}
    return DataProto.from_dict(tensors, {F.MULTI_MODAL_INPUTS: np.array(inputs, dtype=object)}, {"do_sample": False})


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_qwen25_vl_video_prompts_give_the_same_tokens_on_the_engine_and_the_hf_rollout(tmp_path):
    model, processor, _ = make_tiny_vlm(tmp_path / "vlm", arch="qwen2_5_vl")
    batch = _video_batch(processor)
    width = batch.batch[F.INPUT_IDS].shape[1]
    config = RolloutConfig(prompt_length=width, response_length=6, ignore_eos=True, max_num_batched_tokens=256)
    engine_rollout = build_rollout(config, model, tokenizer=processor.tokenizer)
    assert isinstance(engine_rollout, EngineRollout)
    engine_out = engine_rollout.generate_sequences(batch).batch[F.RESPONSES]
    config.name = "hf"
    hf_out = build_rollout(config, model, tokenizer=processor.tokenizer).generate_sequences(batch).batch[F.RESPONSES]
    assert torch.equal(engine_out, hf_out)
    assert not torch.equal(engine_out[0], engine_out[1])  # the frame rate moves the positions, so the tokens
