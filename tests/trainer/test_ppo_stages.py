"""The controller's batch handling around worker calls: uids, generation input and merge, rewards, seeds."""

from __future__ import annotations

import numpy as np
import torch

from hyflow import fields as F
from hyflow.config import PPOTrainerConfig
from hyflow.protocol import DataProto
from hyflow.trainer import stages


def prompt_dict(num_prompts: int = 2, width: int = 4) -> dict:
    return {
        F.INPUT_IDS: torch.arange(num_prompts * width).reshape(num_prompts, width),
        F.ATTENTION_MASK: torch.ones(num_prompts, width, dtype=torch.long),
        F.POSITION_IDS: torch.arange(width).repeat(num_prompts, 1),
        F.DATA_SOURCE: np.array(["arith"] * num_prompts, dtype=object),
        F.REWARD_MODEL: np.array([{"ground_truth": str(i)} for i in range(num_prompts)], dtype=object),
    }


def fake_rollout(gen_input: DataProto, response_width: int = 3) -> DataProto:
    """What the engine returns: prompts widened by responses, the input's non-tensor fields copied through."""
    rows = len(gen_input)
    responses = torch.full((rows, response_width), 7)
    response_mask = torch.ones(rows, response_width, dtype=torch.long)
    tensors = {
        F.PROMPTS: gen_input.batch[F.INPUT_IDS],
        F.RESPONSES: responses,
        F.INPUT_IDS: torch.cat([gen_input.batch[F.INPUT_IDS], responses], dim=1),
        F.ATTENTION_MASK: torch.cat([gen_input.batch[F.ATTENTION_MASK], response_mask], dim=1),
        F.POSITION_IDS: torch.arange(7).repeat(rows, 1),
    }
    non_tensors = {**gen_input.non_tensor_batch, F.FINISH_REASON: np.array(["length"] * rows, dtype=object)}
    return DataProto.from_dict(tensors, non_tensors, meta_info={F.METRICS: {"agent/x": 1.0}})


def test_every_prompt_gets_its_own_uid_and_its_repeats_share_it():
    batch = stages.new_prompt_batch(prompt_dict()).repeat(3, interleave=True)

    uids = list(batch.non_tensor_batch[F.UID])
    assert uids[:3] == [uids[0]] * 3 and uids[3:] == [uids[3]] * 3 and uids[0] != uids[3]


def test_the_rollout_output_replaces_the_prompt_tensors_and_keeps_the_batch_fields():
    batch = stages.new_prompt_batch(prompt_dict())
    gen_input = stages.generation_input(batch, with_chat=False, meta_info={F.SEED: 5})
    assert set(gen_input.batch.keys()) == set(stages.GENERATION_INPUTS) and not gen_input.non_tensor_batch

    merged = stages.merge_generation(batch, fake_rollout(gen_input))

    assert merged.batch[F.INPUT_IDS].shape == (2, 7) and merged.batch[F.RESPONSES].shape == (2, 3)
    assert list(merged.non_tensor_batch[F.UID]) == list(batch.non_tensor_batch[F.UID])
    assert list(merged.non_tensor_batch[F.FINISH_REASON]) == ["length", "length"]
    assert F.METRICS not in merged.meta_info


def test_reward_extras_become_per_row_fields():
    batch = stages.new_prompt_batch(prompt_dict())
    batch = stages.merge_generation(batch, fake_rollout(stages.generation_input(batch, False, {})))

    def reward_fn(data, return_dict=True):
        scores = torch.zeros(len(data), 3)
        scores[:, -1] = torch.tensor([1.0, 0.0])
        return {"reward_tensor": scores, "reward_extra_info": {"acc": [1.0, 0.0]}}

    batch, extra = stages.attach_reward(batch, reward_fn)

    assert stages.sequence_scores(batch.batch[F.TOKEN_LEVEL_SCORES]).tolist() == [1.0, 0.0]
    assert list(batch.non_tensor_batch["acc"]) == [1.0, 0.0] and extra == {"acc": [1.0, 0.0]}


def test_sampling_seeds_are_stable_and_differ_across_steps_and_generation_batches():
    seeds = {stages.sampling_seed(1, step, index) for step in range(1, 50) for index in range(3)}

    assert len(seeds) == 49 * 3
    assert stages.sampling_seed(1, 2, 0) == stages.sampling_seed(1, 2, 0) != stages.sampling_seed(2, 2, 0)


def test_an_agent_loops_multi_modal_inputs_replace_the_prompts_in_the_merged_batch():
    """A tool may have added images to a trajectory: its inputs, not the prompt's, go to training."""
    prompt_inputs = [{"image_grid_thw": torch.tensor([[1, 2, 2]])}] * 2
    trajectory_inputs = [{"image_grid_thw": torch.tensor([[1, 2, 2], [1, 4, 4]])}] * 2
    batch = stages.new_prompt_batch({**prompt_dict(), F.MULTI_MODAL_INPUTS: stages.object_array(prompt_inputs)})
    output = fake_rollout(stages.generation_input(batch, with_chat=True, meta_info={}))
    output.non_tensor_batch[F.MULTI_MODAL_INPUTS] = stages.object_array(trajectory_inputs)
    merged = stages.merge_generation(batch, output)
    assert [len(row["image_grid_thw"]) for row in merged.non_tensor_batch[F.MULTI_MODAL_INPUTS]] == [2, 2]


def test_validation_is_due_every_test_freq_steps_and_at_the_last_step_and_never_with_minus_one():
    config = PPOTrainerConfig()
    config.trainer.test_freq = 2
    validator = stages.Validator(config, tokenizer=None, loader=[], reward_fn=None)
    assert [step for step in range(1, 6) if validator.is_due(step, total_steps=5)] == [2, 4, 5]
    config.trainer.test_freq = -1
    assert not any(validator.is_due(step, total_steps=5) for step in range(1, 6))
