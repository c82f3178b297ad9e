"""Partial rollouts: weights loaded while requests run (pause, load_weights, resume). Every token records the policy
version that sampled it, and its log-prob is that version's: with `partial_rollout_kv="recompute"` equal to a
re-score of the whole sequence under those weights; with "keep" the tokens after the load attend to the old
weights' K/V, and the test measures how far that drifts."""

from __future__ import annotations

import asyncio

import pytest
import torch

from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine

from .engine_testkit import hf_greedy, make_tiny_hf_model, pause_after_steps, rescore

PROMPTS = [[5, 9, 13, 17, 21, 3, 7], [11, 4, 8], [30, 31, 32, 33, 34, 35, 36, 37, 38]]
NUM_TOKENS = 16
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
SAMPLED = SamplingParams(temperature=1.0, max_tokens=NUM_TOKENS, ignore_eos=True, seed=7)
# (num_scheduler_steps, async_scheduling): single steps, and decode windows with the next one queued ahead
SCHEDULES = {"single-step": (1, False), "async-windows": (4, True)}


@pytest.fixture(scope="module")
def models() -> dict[int, torch.nn.Module]:
    """The weights of policy version 0 and of version 1."""
    return {0: make_tiny_hf_model("qwen2", seed=0), 1: make_tiny_hf_model("qwen2", seed=1)}


def make_engine(model: torch.nn.Module, schedule: str = "single-step", kv: str = "recompute") -> LLMEngine:
    steps, queue_ahead = SCHEDULES[schedule]
    config = EngineConfig(
        block_size=4,
        max_model_len=64,
        max_num_batched_tokens=64,
        num_kv_blocks=64,
        num_scheduler_steps=steps,
        async_scheduling=queue_ahead,
        partial_rollout_kv=kv,
    )
    return LLMEngine(model, config)


def run_with_update(engine: LLMEngine, new_model: torch.nn.Module, params: SamplingParams, steps_before: int) -> list:
    """Generates PROMPTS, loading `new_model` as policy version 1 after `steps_before` steps; the outputs in order."""
    ids = [engine.add_request(prompt, params) for prompt in PROMPTS]
    finished = {}
    for _ in range(steps_before):
        finished.update((out.request_id, out) for out in engine.step())
    engine.pause()
    assert engine.step() == []  # paused: nothing runs
    engine.load_weights(new_model.state_dict().items(), policy_version=1)
    engine.resume()
    while engine.has_unfinished_requests():
        finished.update((out.request_id, out) for out in engine.step())
    return [finished[i].outputs[0] for i in ids]


def tokens_before_update(versions: list[int]) -> int:
    """How many leading tokens version 0 sampled, checking the versions are 0 ... 0 1 ... 1 with both present."""
    cut = versions.count(0)
    assert versions == [0] * cut + [1] * (len(versions) - cut) and 0 < cut < len(versions), versions
    return cut


def assert_greedy_under_each_tokens_version(models, prompt: list[int], out) -> None:
    """Every token is the greedy choice of its version's weights given all tokens before it (so none was lost or
    duplicated): what `transformers` greedy gives before the update, and from the new weights on after it."""
    assert len(out.token_ids) == len(out.log_probs) == len(out.policy_versions) == NUM_TOKENS
    assert rescore(models, prompt, out.token_ids, out.policy_versions)[1] == out.token_ids


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_greedy_tokens_are_the_old_policys_before_the_update_and_the_new_policys_after(models, schedule):
    outputs = run_with_update(make_engine(models[0], schedule), models[1], GREEDY, steps_before=2)
    for prompt, out in zip(PROMPTS, outputs):
        cut = tokens_before_update(out.policy_versions)
        assert_greedy_under_each_tokens_version(models, prompt, out)
    assert outputs[0].token_ids[:cut] == hf_greedy(models[0], PROMPTS[0], cut)  # the reference, once


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_recomputed_kv_gives_log_probs_equal_to_a_rescore_under_the_version_of_each_token(models, schedule):
    outputs = run_with_update(make_engine(models[0], schedule), models[1], SAMPLED, steps_before=2)
    for prompt, out in zip(PROMPTS, outputs):
        tokens_before_update(out.policy_versions)
        expected, _ = rescore(models, prompt, out.token_ids, out.policy_versions)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-5, rtol=1e-5)


def test_kept_kv_continues_without_recompute_and_drifts_from_the_new_policys_rescore(models):
    engine = make_engine(models[0], kv="keep")
    ids = [engine.add_request(prompt, SAMPLED) for prompt in PROMPTS]
    engine.step()
    engine.step()
    engine.pause()
    engine.load_weights(models[1].state_dict().items(), policy_version=1)
    assert len(engine.scheduler.running) == len(PROMPTS) and not engine.scheduler.waiting  # nothing re-prefilled
    engine.resume()
    outputs = {}
    while engine.has_unfinished_requests():
        outputs.update((out.request_id, out.outputs[0]) for out in engine.step())
    drift = []
    for prompt, request_id in zip(PROMPTS, ids):
        out = outputs[request_id]
        cut = tokens_before_update(out.policy_versions)
        expected, _ = rescore(models, prompt, out.token_ids, out.policy_versions)
        actual = torch.tensor(out.log_probs)
        torch.testing.assert_close(actual[:cut], expected[:cut], atol=1e-5, rtol=1e-5)  # before: exact
        drift.append((actual[cut:] - expected[cut:]).abs().max())
    # After the load the keys and values of the earlier tokens are the old policy's: the log-probs are those of
    # neither policy (on these tiny random models ~0.1-1 nats; the docs give the measured numbers).
    assert min(drift) > 1e-3


def test_a_new_request_never_shares_blocks_whose_kv_came_from_the_old_weights(models):
    engine = make_engine(models[0], kv="keep")
    engine.add_request(PROMPTS[0], GREEDY, request_id="kept")
    engine.step()
    engine.step()
    engine.pause()
    engine.load_weights(models[1].state_dict().items(), policy_version=1)
    engine.resume()
    kept_tokens = list(engine.requests["kept"][1][0].token_ids)  # prompt + tokens so far, whose blocks are stale
    # The same prefix again: were the stale blocks shared, its tokens would not be the new policy's.
    engine.add_request(kept_tokens, GREEDY, request_id="fresh")
    outputs = {}
    while engine.has_unfinished_requests():
        outputs.update((out.request_id, out.outputs[0]) for out in engine.step())
    assert_greedy_under_each_tokens_version(models, kept_tokens, outputs["fresh"])
    assert outputs["fresh"].policy_versions == [1] * NUM_TOKENS


def test_requests_added_or_aborted_while_paused_wait_or_end_with_their_partial_output(models):
    engine = make_engine(models[0])
    engine.add_request(PROMPTS[0], GREEDY, request_id="running")
    engine.step()
    engine.step()
    engine.pause()
    engine.add_request(PROMPTS[1], GREEDY, request_id="late")
    assert engine.step() == [] and engine.requests["late"][1][0].output_token_ids == []  # it waits
    aborted = engine.abort("running").outputs[0]
    assert aborted.finish_reason == "abort" and aborted.policy_versions == [0] * len(aborted.token_ids) == [0, 0]
    engine.load_weights(models[1].state_dict().items())  # no version given: one more
    assert engine.policy_version == 1
    engine.resume()
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    (late,) = [out.outputs[0] for out in outputs]
    assert late.policy_versions == [1] * NUM_TOKENS
    assert_greedy_under_each_tokens_version(models, PROMPTS[1], late)


def test_generate_while_paused_and_a_version_that_goes_back_are_clear_errors(models):
    engine = make_engine(models[0])
    engine.load_weights(models[0].state_dict().items(), policy_version=3)
    with pytest.raises(ValueError, match="would go back from the engine's policy_version 3"):
        engine.load_weights(models[0].state_dict().items(), policy_version=2)
    engine.pause()
    with pytest.raises(RuntimeError, match="engine is paused"):
        engine.generate(PROMPTS, GREEDY)
    engine.resume()
    assert all(o.outputs[0].policy_versions == [3] * NUM_TOKENS for o in engine.generate(PROMPTS, GREEDY))


@pytest.mark.timeout(60)
def test_async_callers_wait_through_a_pause_and_get_the_tokens_of_both_policies(models):
    engine = make_engine(models[0], "async-windows")
    async_engine = AsyncLLMEngine(engine)
    pause_after_steps(engine, 2)

    async def main():
        running = [
            asyncio.create_task(async_engine.generate(p, GREEDY, request_id=f"r{i}")) for i, p in enumerate(PROMPTS)
        ]
        while not engine.paused:  # it pauses itself after its second step
            await asyncio.sleep(0.001)
        await async_engine.pause()  # paused already: a no-op
        counts = [len(seqs[0].output_token_ids) for _, seqs in engine.requests.values()]
        late = asyncio.create_task(async_engine.generate(PROMPTS[0], GREEDY, request_id="late"))
        aborted = asyncio.create_task(async_engine.generate(PROMPTS[1], GREEDY, request_id="aborted"))
        await asyncio.sleep(0.05)  # the step loop would run now, were it not paused
        assert [len(seqs[0].output_token_ids) for _, seqs in list(engine.requests.values())[:3]] == counts
        assert engine.requests["late"][1][0].output_token_ids == []
        await async_engine.abort("aborted")
        await async_engine.load_weights(models[1].state_dict().items(), policy_version=1)
        await async_engine.resume()
        return await asyncio.gather(*running), await late, await aborted

    outputs, late, aborted = asyncio.run(main())
    for prompt, out in zip(PROMPTS, outputs):
        tokens_before_update(out.outputs[0].policy_versions)
        assert_greedy_under_each_tokens_version(models, prompt, out.outputs[0])
    assert late.outputs[0].policy_versions == [1] * NUM_TOKENS
    assert_greedy_under_each_tokens_version(models, PROMPTS[0], late.outputs[0])
    assert aborted.outputs[0].finish_reason == "abort" and aborted.outputs[0].token_ids == []
    assert not engine.has_unfinished_requests()
