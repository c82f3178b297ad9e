"""AsyncLLMEngine: concurrent callers share one step loop, abort returns partial output, bad input fails alone."""

from __future__ import annotations

import asyncio

import pytest
import torch

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


@pytest.mark.timeout(60)
def test_a_stream_yields_growing_outputs_and_ends_with_the_batch_apis_output(engine):
    expected = engine.generate([PROMPTS[0]], GREEDY)[0].outputs[0]
    async_engine = AsyncLLMEngine(engine)

    async def main():
        return [out async for out in async_engine.stream(PROMPTS[0], GREEDY, request_id="s")]

    outputs = asyncio.run(main())
    lengths = [len(out.outputs[0].token_ids) for out in outputs]
    assert lengths == sorted(lengths) and len(set(lengths)) == len(lengths) and len(outputs) >= 2
    assert all(out.outputs[0].finish_reason is None for out in outputs[:-1])
    final = outputs[-1].outputs[0]
    assert (final.token_ids, final.finish_reason) == (expected.token_ids, expected.finish_reason)
    assert all(expected.token_ids[: len(out.outputs[0].token_ids)] == out.outputs[0].token_ids for out in outputs)


@pytest.mark.timeout(60)
def test_a_cancelled_caller_and_a_closed_stream_abort_their_requests(engine):
    async_engine = AsyncLLMEngine(engine)
    long = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)

    async def main():
        task = asyncio.create_task(async_engine.generate(PROMPTS[0], long, request_id="gone"))
        while "gone" not in engine.requests or not engine.requests["gone"][1][0].output_token_ids:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert "gone" not in engine.requests
        stream = async_engine.stream(PROMPTS[1], long, request_id="closed")
        first = await anext(stream)
        await stream.aclose()
        return first

    first = asyncio.run(main())
    assert first.outputs[0].finish_reason is None
    assert not engine.has_unfinished_requests()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_scheduler_steps", [1, 4])
def test_top_log_probs_are_the_most_likely_tokens_of_the_sampled_distribution(num_scheduler_steps):
    hf = make_tiny_hf_model("qwen2")
    config = EngineConfig(block_size=4, max_model_len=64, num_kv_blocks=64, num_scheduler_steps=num_scheduler_steps)
    engine = LLMEngine(hf, config)
    params = [
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, top_log_probs=3),
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),  # asks for none, in the same batch
    ]
    asked, plain = (request.outputs[0] for request in engine.generate(PROMPTS[:2], params))
    assert plain.top_log_probs is None and len(asked.top_log_probs) == len(asked.token_ids) == 6
    ids = PROMPTS[0] + asked.token_ids
    with torch.no_grad():
        log_probs = hf(torch.tensor([ids])).logits[0, len(PROMPTS[0]) - 1 : -1].log_softmax(-1)
    for position, (token, log_prob, top) in enumerate(zip(asked.token_ids, asked.log_probs, asked.top_log_probs)):
        expected = log_probs[position].topk(3)
        assert list(top) == expected.indices.tolist() and next(iter(top)) == token  # greedy: the best first
        torch.testing.assert_close(torch.tensor(list(top.values())), expected.values, atol=1e-4, rtol=1e-4)
        assert top[token] == pytest.approx(log_prob, abs=1e-6)


def test_top_log_probs_beyond_the_limit_name_it():
    with pytest.raises(ValueError, match=r"top_log_probs=21 .* \[0, 20\]"):
        SamplingParams(top_log_probs=21)


@pytest.fixture(scope="module")
def engine_with_tokenizer(tmp_path_factory) -> LLMEngine:
    from transformers import AutoTokenizer

    from hyflow.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("async_detokenize") / "tiny", hidden_size=32)
    config = EngineConfig(block_size=4, max_model_len=64, num_kv_blocks=64, num_scheduler_steps=2)
    return LLMEngine(path, config, AutoTokenizer.from_pretrained(path))


@pytest.mark.timeout(60)
def test_a_detokenizing_stream_carries_its_text_so_far_each_a_prefix_of_the_final_text(engine_with_tokenizer):
    async_engine = AsyncLLMEngine(engine_with_tokenizer)
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=3)

    async def main():
        return [out async for out in async_engine.stream(PROMPTS[0], params, detokenize=True)]

    outputs = asyncio.run(main())
    final = outputs[-1].outputs[0]
    assert len(outputs) >= 2 and final.text == engine_with_tokenizer.tokenizer.decode(
        final.token_ids, skip_special_tokens=True
    )
    for output in outputs[:-1]:
        assert output.outputs[0].text is not None and final.text.startswith(output.outputs[0].text)


@pytest.mark.timeout(60)
def test_a_reader_that_falls_behind_gets_the_tokens_of_several_steps_in_its_next_output(engine):
    async_engine = AsyncLLMEngine(engine)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)

    async def main():
        stream = async_engine.stream(PROMPTS[1], params, request_id="slow")
        first = await anext(stream)
        while engine.has_unfinished_requests():  # the reader is away while the engine steps on
            await asyncio.sleep(0.005)
        return [first] + [out async for out in stream]

    outputs = asyncio.run(main())
    assert len(outputs) == 2 and len(outputs[1].outputs[0].token_ids) == 20  # one output for all later steps
    assert outputs[1].outputs[0].finish_reason == "length"
