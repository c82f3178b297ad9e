"""AsyncLLMEngine: concurrent callers share one step loop, abort returns partial output, bad input fails alone."""

from __future__ import annotations

import asyncio

import pytest

from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine

from .engine_testkit import make_tiny_hf_model

PROMPTS = [[5, 9, 13, 17, 21, 3, 7], [11, 4, 8], [30, 31, 32, 33, 34, 35, 36, 37, 38]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    config = EngineConfig(block_size=4, max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=64)
    return LLMEngine(make_tiny_hf_model("qwen2"), config)


@pytest.mark.timeout(60)
def test_concurrent_callers_get_the_same_outputs_as_the_batch_api(engine):
    expected = [out.outputs[0].token_ids for out in engine.generate(PROMPTS, GREEDY)]
    async_engine = AsyncLLMEngine(engine)

    async def main():
        async def one(i):
            await asyncio.sleep(0.01 * i)  # arrive while the others are running
            return await async_engine.generate(PROMPTS[i], GREEDY, request_id=f"r{i}")

        return await asyncio.gather(*(one(i) for i in range(3)))

    outputs = asyncio.run(main())
    assert [out.outputs[0].token_ids for out in outputs] == expected
    assert [out.request_id for out in outputs] == ["r0", "r1", "r2"]


@pytest.mark.timeout(60)
def test_abort_returns_the_partial_output_to_the_waiting_caller(engine):
    async_engine = AsyncLLMEngine(engine)
    long = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)

    async def main():
        task = asyncio.create_task(async_engine.generate(PROMPTS[0], long, request_id="long"))
        while not engine.has_unfinished_requests() or not engine.requests["long"][1][0].output_token_ids:
            await asyncio.sleep(0.005)
        await async_engine.abort("long")
        return await task

    output = asyncio.run(main())
    assert output.outputs[0].finish_reason == "abort" and 0 < len(output.outputs[0].token_ids) < 50
    assert not engine.has_unfinished_requests()


@pytest.mark.timeout(60)
def test_a_bad_request_raises_for_its_caller_while_others_complete(engine):
    async_engine = AsyncLLMEngine(engine)

    async def main():
        good = asyncio.create_task(async_engine.generate(PROMPTS[1], GREEDY))
        with pytest.raises(ValueError, match="prompt is empty"):
            await async_engine.generate([], GREEDY)
        return await good

    assert len(asyncio.run(main()).outputs[0].token_ids) == 8
    # A second event loop (e.g. a new asyncio.run) gets a fresh step loop.
    assert len(asyncio.run(async_engine.generate(PROMPTS[2], GREEDY)).outputs[0].token_ids) == 8
