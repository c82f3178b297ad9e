"""The rollout the actor worker composes: DataProto layout, log-probs the actor can reproduce, the hf fallback,
weight loading by (wrapped) HF names."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from hyflow import fields as F
from hyflow.config.actor_rollout_ref import RolloutConfig
from hyflow.rollout.hf_rollout import HFRollout
from hyflow.rollout.worker_rollout import EngineRollout, build_rollout

from ..engine.engine_testkit import hf_greedy, make_tiny_hf_model, pause_after_steps, rescore
from .rollout_testkit import PAD, prompt_batch

PROMPTS = [[5, 9, 13, 17, 21, 3], [11, 4, 8], [30, 31, 32, 33]]


def _config(**overrides) -> RolloutConfig:
    settings = dict(prompt_length=8, response_length=6, ignore_eos=True, max_num_seqs=8, max_num_batched_tokens=64)
    settings.update(overrides)
    return RolloutConfig(**settings)


def test_generate_sequences_returns_the_actor_layout_with_greedy_responses():
    hf = make_tiny_hf_model("qwen2")
    rollout = build_rollout(_config(), hf, tokenizer=None)
    assert isinstance(rollout, EngineRollout)
    out = rollout.generate_sequences(prompt_batch(PROMPTS, do_sample=False))
    batch = out.batch
    assert batch[F.PROMPTS].shape == (3, 6) and batch[F.RESPONSES].shape == (3, 6)
    assert batch[F.INPUT_IDS].shape == batch[F.ATTENTION_MASK].shape == batch[F.POSITION_IDS].shape == (3, 12)
    for i, prompt in enumerate(PROMPTS):
        assert batch[F.RESPONSES][i].tolist() == hf_greedy(hf, prompt, 6)
    assert batch[F.RESPONSE_MASK].sum().item() == 18
    assert batch[F.POSITION_IDS][1].tolist() == [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert list(out.non_tensor_batch[F.FINISH_REASON]) == ["length"] * 3


def test_rollout_log_probs_equal_the_actor_forward_on_the_returned_layout():
    hf = make_tiny_hf_model("llama")
    rollout = build_rollout(_config(temperature=1.0, do_sample=True, ignore_eos=False), hf, tokenizer=None)
    out = rollout.generate_sequences(prompt_batch(PROMPTS)).batch
    with torch.no_grad():
        logits = hf(
            input_ids=out[F.INPUT_IDS], attention_mask=out[F.ATTENTION_MASK], position_ids=out[F.POSITION_IDS]
        ).logits
    prompt_len = out[F.PROMPTS].shape[1]
    log_probs = logits[:, prompt_len - 1 : -1].log_softmax(-1).gather(2, out[F.RESPONSES].unsqueeze(2)).squeeze(2)
    mask = out[F.RESPONSE_MASK].bool()
    torch.testing.assert_close(out[F.ROLLOUT_LOG_PROBS][mask], log_probs[mask], atol=1e-4, rtol=1e-4)
    padded = ~mask
    assert (out[F.RESPONSES][padded] == PAD).all()


def test_rollout_name_hf_gives_the_same_greedy_responses_as_the_engine():
    hf = make_tiny_hf_model("qwen3")
    batch = prompt_batch(PROMPTS, do_sample=False)
    engine_out = build_rollout(_config(), hf, tokenizer=None).generate_sequences(batch)
    hf_rollout = build_rollout(_config(name="hf"), hf, tokenizer=None)
    assert isinstance(hf_rollout, HFRollout)
    hf_out = hf_rollout.generate_sequences(batch)
    assert torch.equal(engine_out.batch[F.RESPONSES], hf_out.batch[F.RESPONSES])
    torch.testing.assert_close(
        engine_out.batch[F.ROLLOUT_LOG_PROBS], hf_out.batch[F.ROLLOUT_LOG_PROBS], atol=1e-4, rtol=1e-4
    )


def test_an_unknown_architecture_falls_back_to_hf_with_a_warning(caplog):
    hf = make_tiny_hf_model("llama")
    hf.config.architectures = ["MyCustomForCausalLM"]
    hf.config.model_type = "custom"
    with caplog.at_level(logging.WARNING):
        rollout = build_rollout(_config(), hf, tokenizer=None)
    assert isinstance(rollout, HFRollout) and "falling back to rollout.name=hf" in caplog.text


def test_load_weights_accepts_wrapped_names_and_rejects_unmerged_lora():
    old, new = make_tiny_hf_model("llama", seed=0), make_tiny_hf_model("llama", seed=1)
    rollout = build_rollout(_config(), old, tokenizer=None)
    rollout.load_weights((f"base_model.model.{name}", t) for name, t in new.state_dict().items())
    out = rollout.generate_sequences(prompt_batch(PROMPTS[:1], do_sample=False))
    assert out.batch[F.RESPONSES][0].tolist() == hf_greedy(new, PROMPTS[0], 6)
    with pytest.raises(ValueError, match="unmerged LoRA"):
        rollout.load_weights([("model.layers.0.self_attn.q_proj.lora_A.default.weight", torch.zeros(1))])


def test_an_unavailable_rollout_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"rollout\.name='vllm'"):
        build_rollout(_config(name="vllm"), make_tiny_hf_model("llama"), tokenizer=None)


def test_tensor_parallel_rollout_without_a_process_group_is_a_clear_error():
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=2 needs a torch\.distributed process group"):
        build_rollout(_config(tensor_model_parallel_size=2), make_tiny_hf_model("llama"), tokenizer=None)


@pytest.mark.timeout(120)
def test_an_update_in_flight_gives_rows_with_the_tokens_of_both_versions_and_their_log_probs():
    models = {0: make_tiny_hf_model("qwen2", seed=0), 1: make_tiny_hf_model("qwen2", seed=1)}
    config = _config(response_length=12, do_sample=True, temperature=1.0)
    rollout = build_rollout(config, models[0], tokenizer=None)
    engine = rollout.engine
    pause_after_steps(engine, 2)

    async def main():
        generating = asyncio.create_task(rollout.generate_sequences_async(prompt_batch(PROMPTS, seed=3)))
        while not engine.paused:  # it pauses itself after its second step
            await asyncio.sleep(0.001)
        await rollout.update_weights_in_flight(models[1].state_dict().items(), policy_version=1)
        return await generating

    out = asyncio.run(main())
    batch, mask = out.batch, out.batch[F.RESPONSE_MASK].bool()
    assert rollout.policy_version == 1
    for i, prompt in enumerate(PROMPTS):
        versions, tokens = batch[F.ROLLOUT_POLICY_VERSIONS][i][mask[i]].tolist(), batch[F.RESPONSES][i][mask[i]]
        cut = versions.count(0)
        assert versions == [0] * cut + [1] * (12 - cut) and 0 < cut < 12
        expected, _ = rescore(models, prompt, tokens.tolist(), versions)
        torch.testing.assert_close(batch[F.ROLLOUT_LOG_PROBS][i][mask[i]], expected, atol=1e-5, rtol=1e-5)
    assert list(out.non_tensor_batch[F.ROLLOUT_POLICY_VERSION_MIN]) == [0, 0, 0]
    assert list(out.non_tensor_batch[F.ROLLOUT_POLICY_VERSION_MAX]) == [1, 1, 1]
    metrics = out.meta_info[F.METRICS]
    assert metrics["rollout/token_fraction_lag_0"] + metrics["rollout/token_fraction_lag_1"] == pytest.approx(1.0)


@pytest.mark.timeout(60)
def test_an_update_with_no_request_in_flight_loads_without_pausing_the_engine():
    """A blocking generate_sequences served by the worker's event loop while the weights' buckets are received
    must not find the engine paused (it refuses to wait for ever)."""
    models = {0: make_tiny_hf_model("qwen2", seed=0), 1: make_tiny_hf_model("qwen2", seed=1)}
    rollout = build_rollout(_config(response_length=4), models[0], tokenizer=None)
    seen_paused = []

    def buckets():
        for item in models[1].state_dict().items():
            seen_paused.append(rollout.engine.paused)
            yield item

    loaded = asyncio.run(rollout.update_weights_in_flight(buckets(), policy_version=1))
    assert loaded > 0 and seen_paused and not any(seen_paused)
    assert rollout.policy_version == 1
    rollout.generate_sequences(prompt_batch(PROMPTS, seed=3))  # the engine serves the next blocking call


def _image_batch(processor, model_config) -> tuple:
    """(two left-padded image prompts (one image; two images) as the dataset hands them to the rollout, the
    processor's outputs of each)."""
    import numpy as np

    from hyflow.data.multimodal import mrope_position_ids
    from hyflow.protocol import DataProto

    from ..engine.vlm_testkit import image_prompt, random_image

    rows = [image_prompt(processor, [random_image(0)]), image_prompt(processor, [random_image(1), random_image(2)])]
    width = max(row["input_ids"].shape[1] for row in rows)
    pad = processor.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - r["input_ids"].shape[1]) + r["input_ids"][0].tolist() for r in rows])
    mask = (torch.arange(width) >= width - torch.tensor([[r["input_ids"].shape[1]] for r in rows])).long()
    merge = model_config.vision_config.spatial_merge_size
    positions = torch.stack(
        [
            mrope_position_ids(i, m, r["image_grid_thw"], model_config.image_token_id, merge)
            for i, m, r in zip(ids, mask, rows)
        ]
    )
    images = np.array([{k: r[k] for k in ("pixel_values", "image_grid_thw")} for r in rows], dtype=object)
    tensors = {F.INPUT_IDS: ids, F.ATTENTION_MASK: mask, F.POSITION_IDS: positions}
    return DataProto.from_dict(tensors, {F.MULTI_MODAL_INPUTS: images}, meta_info={"do_sample": False}), rows


def test_image_prompts_run_on_the_engine_with_the_hf_rollouts_tokens_and_the_models_log_probs(tmp_path):
    from ..engine.vlm_testkit import hf_logits, make_tiny_vlm

    model, processor, _ = make_tiny_vlm(tmp_path / "vlm")
    batch, rows = _image_batch(processor, model.config)
    config = _config(prompt_length=batch.batch[F.INPUT_IDS].shape[1], max_num_batched_tokens=256)
    engine_rollout = build_rollout(config, model, tokenizer=processor.tokenizer)
    assert isinstance(engine_rollout, EngineRollout)
    out = engine_rollout.generate_sequences(batch).batch
    hf_out = build_rollout(_config(name="hf"), model, tokenizer=processor.tokenizer).generate_sequences(batch)
    assert torch.equal(out[F.RESPONSES], hf_out.batch[F.RESPONSES])
    for i, row in enumerate(rows):  # the log-probs of the model's own distribution (the hf rollout's suppress tokens)
        response = out[F.RESPONSES][i].tolist()
        expected = hf_logits(model, row, response[:-1]).log_softmax(-1).gather(1, torch.tensor([response]).T)[:, 0]
        torch.testing.assert_close(out[F.ROLLOUT_LOG_PROBS][i], expected, atol=1e-4, rtol=1e-4)


def test_a_sampled_vision_token_ends_the_response_before_it():
    from hyflow.engine.sequence import CompletionOutput
    from hyflow.rollout.worker_rollout import without_vision_markup

    output = CompletionOutput(0, [7, 8, 151655], [-0.1, -0.2, -0.3], "stop")
    trimmed = without_vision_markup(output, [151655, 151652])
    assert (trimmed.token_ids, trimmed.log_probs, trimmed.finish_reason) == ([7, 8], [-0.1, -0.2], "stop")
    assert without_vision_markup(trimmed, [151655]) is trimmed
