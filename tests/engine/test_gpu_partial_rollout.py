"""Partial rollouts on CUDA: a pause lands on a step boundary of the CUDA path too — CUDA-graph decode, multi-step
windows, and a window queued ahead by async scheduling (dropped by the pause, sampled anew by the new weights).
Every token is then its version's greedy choice and its log-prob that version's re-score (fp32; the references run
on the CPU)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine

from .engine_testkit import make_tiny_hf_model, pause_after_steps, rescore

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 9, 13, 17, 21, 3, 7, 8, 9], [11, 4, 8], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]]
NUM_TOKENS = 30
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
SAMPLED = SamplingParams(temperature=1.0, max_tokens=NUM_TOKENS, ignore_eos=True, seed=11)


@pytest.fixture(scope="module")
def models() -> dict[int, torch.nn.Module]:
    return {0: make_tiny_hf_model("qwen2", seed=0), 1: make_tiny_hf_model("qwen2", seed=1)}


def cuda_engine(model: torch.nn.Module, **overrides) -> LLMEngine:
    settings = dict(block_size=4, max_model_len=64, num_kv_blocks=128, dtype="float32", device="cuda")
    return LLMEngine(model, EngineConfig(**{**settings, **overrides}))


def check_versions_and_log_probs(models, outputs, atol: float = 1e-4) -> None:
    for prompt, out in zip(PROMPTS, outputs):
        versions = out.policy_versions
        cut = versions.count(0)
        assert versions == [0] * cut + [1] * (NUM_TOKENS - cut) and 0 < cut < NUM_TOKENS, versions
        assert len(out.token_ids) == len(out.log_probs) == NUM_TOKENS
        expected, _ = rescore(models, prompt, out.token_ids, versions)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=atol, rtol=atol)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_scheduler_steps", [1, 8], ids=["single-step", "multi-step"])
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["cuda-graphs", "eager"])
def test_a_pause_with_a_window_queued_ahead_gives_each_token_its_versions_log_prob(
    models, enforce_eager, num_scheduler_steps
):
    for params in (GREEDY, SAMPLED):
        engine = cuda_engine(models[0], enforce_eager=enforce_eager, num_scheduler_steps=num_scheduler_steps)
        ids = [engine.add_request(prompt, params) for prompt in PROMPTS]
        finished = {}
        for _ in range(3):
            finished.update((out.request_id, out.outputs[0]) for out in engine.step())
        if num_scheduler_steps > 1:
            assert engine.in_flight.queued is not None, "async scheduling queued no window ahead to drop"
        engine.pause()
        assert engine.in_flight.queued is None
        engine.load_weights(models[1].state_dict().items(), policy_version=1)
        engine.resume()
        while engine.has_unfinished_requests():
            finished.update((out.request_id, out.outputs[0]) for out in engine.step())
        outputs = [finished[i] for i in ids]
        check_versions_and_log_probs(models, outputs)
        if params is GREEDY:
            for prompt, out in zip(PROMPTS, outputs):
                assert rescore(models, prompt, out.token_ids, out.policy_versions)[1] == out.token_ids
    if not enforce_eager:
        graphs = engine.runner.graphs
        assert graphs.window_graphs if num_scheduler_steps > 1 else graphs.graphs, "no CUDA graph was replayed"


@pytest.mark.timeout(300)
def test_kept_kv_on_cuda_keeps_the_tokens_before_the_update_exact(models):
    engine = cuda_engine(models[0], partial_rollout_kv="keep")
    ids = [engine.add_request(prompt, SAMPLED) for prompt in PROMPTS]
    finished = {}
    for _ in range(3):
        finished.update((out.request_id, out.outputs[0]) for out in engine.step())
    engine.pause()
    engine.load_weights(models[1].state_dict().items(), policy_version=1)
    assert not engine.scheduler.waiting  # nothing re-prefilled
    engine.resume()
    while engine.has_unfinished_requests():
        finished.update((out.request_id, out.outputs[0]) for out in engine.step())
    for prompt, request_id in zip(PROMPTS, ids):
        out = finished[request_id]
        cut = out.policy_versions.count(0)
        assert 0 < cut < NUM_TOKENS and len(out.token_ids) == NUM_TOKENS
        expected, _ = rescore(models, prompt, out.token_ids, out.policy_versions)
        torch.testing.assert_close(torch.tensor(out.log_probs[:cut]), expected[:cut], atol=1e-4, rtol=1e-4)


@pytest.mark.timeout(300)
def test_the_async_engine_pauses_its_cuda_step_loop_and_resumes_under_the_new_weights(models):
    engine = cuda_engine(models[0])
    async_engine = AsyncLLMEngine(engine)
    pause_after_steps(engine, 3)

    async def main():
        running = [
            asyncio.create_task(async_engine.generate(p, SAMPLED, request_id=f"r{i}")) for i, p in enumerate(PROMPTS)
        ]
        while not engine.paused:
            await asyncio.sleep(0.001)
        late = asyncio.create_task(async_engine.generate(PROMPTS[0], SAMPLED, request_id="late"))
        await async_engine.load_weights(models[1].state_dict().items(), policy_version=1)
        await async_engine.resume()
        return [out.outputs[0] for out in await asyncio.gather(*running)], (await late).outputs[0]

    outputs, late = asyncio.run(main())
    check_versions_and_log_probs(models, outputs)
    assert late.policy_versions == [1] * NUM_TOKENS
    expected, _ = rescore(models, PROMPTS[0], late.token_ids, late.policy_versions)
    torch.testing.assert_close(torch.tensor(late.log_probs), expected, atol=1e-4, rtol=1e-4)
