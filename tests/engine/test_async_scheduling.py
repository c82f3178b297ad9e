"""Async scheduling (EngineConfig.async_scheduling): the next decode window is queued before the current one's
tokens are read. It gives exactly the outputs of one window at a time — with stops landing mid-window, seeded
sampling, requests joining, aborts, sleep and weight loads while a window is queued — and frees every block."""

from __future__ import annotations

import pytest
import torch

from hyflow.engine.block_manager import BlockManager
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.scheduler import ScheduledBatch, Scheduler
from hyflow.engine.sequence import Sequence, SequenceStatus

from .engine_testkit import assert_same_outputs, engine_outputs, make_tiny_hf_model

PROMPTS = [[5, 9, 13, 17, 21, 3, 7, 8, 9], [11, 4, 8], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]]
SAMPLED = [
    SamplingParams(n=2, temperature=1.0, max_tokens=40, seed=5, ignore_eos=True, raw_log_probs=True),
    SamplingParams(temperature=0, max_tokens=23, ignore_eos=True),
    SamplingParams(temperature=0.8, top_k=10, max_tokens=31, seed=2, ignore_eos=True),
]


@pytest.fixture(scope="module")
def hf() -> torch.nn.Module:
    return make_tiny_hf_model("qwen2")


def _engine(hf, async_scheduling: bool, **overrides) -> LLMEngine:
    settings = dict(block_size=4, max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=96, num_scheduler_steps=4)
    settings["dtype"] = "float32"  # also on CUDA (where the tests run too): the comparisons are exact up to 1e-5
    settings.update(overrides)
    return LLMEngine(hf, EngineConfig(async_scheduling=async_scheduling, **settings))


def _assert_all_blocks_free(engine: LLMEngine) -> None:
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.scheduler.has_unfinished()


@pytest.mark.timeout(120)
def test_queued_windows_give_the_outputs_of_one_window_at_a_time(hf):
    expected = engine_outputs(_engine(hf, False), PROMPTS, SAMPLED)
    engine = _engine(hf, True)
    assert_same_outputs(engine_outputs(engine, PROMPTS, SAMPLED), expected)
    assert engine.in_flight.num_queued_ahead > 5  # windows of 4 steps over responses of 23-40 tokens
    _assert_all_blocks_free(engine)


@pytest.mark.timeout(120)
def test_prefills_queued_behind_each_other_give_the_same_outputs(hf):
    prompts = [prompt[: 3 + i] for i, prompt in enumerate(PROMPTS * 4)]  # 12 prompts, 3-14 tokens
    params = SamplingParams(temperature=0.9, max_tokens=9, seed=21, ignore_eos=True)
    few_tokens = dict(max_num_batched_tokens=24, max_model_len=24)  # 24 prompt tokens per prefill: several prefills
    expected = engine_outputs(_engine(hf, False, **few_tokens), prompts, params)
    engine = _engine(hf, True, **few_tokens)
    for prompt in prompts:
        engine.add_request(prompt, params)
    engine.step()  # the first prefill, read after the second one was queued
    second = engine.in_flight.queued
    assert second is not None and second.batch.is_prefill
    assert all(seq.num_output_tokens == 0 for seq in second.batch.seqs)  # its tokens are not read yet
    while engine.has_unfinished_requests():
        engine.step()
    assert_same_outputs(engine_outputs(engine, prompts, params), expected)
    _assert_all_blocks_free(engine)


@pytest.mark.timeout(120)
def test_sequences_stopping_mid_window_drop_their_rows_of_the_queued_window(hf):
    free = engine_outputs(_engine(hf, False), PROMPTS, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    # Stop tokens that end the first two sequences mid-window (output 0 is the prefill's, windows cover 1-4, 5-8...),
    # while the third runs on: its queued windows keep going with two dead rows.
    params = [
        SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[free[0][0][0][6]]),
        SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[free[1][0][0][10]]),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
    ]
    expected = engine_outputs(_engine(hf, False), PROMPTS, params)
    engine = _engine(hf, True)
    actual = engine_outputs(engine, PROMPTS, params)
    assert_same_outputs(actual, expected)
    assert [r[0][1] for r in actual] == ["stop", "stop", "length"]
    assert len(actual[0][0][0]) <= 7 and len(actual[1][0][0]) <= 11
    _assert_all_blocks_free(engine)


@pytest.mark.timeout(120)
def test_a_request_added_while_a_window_is_queued_joins_after_it_with_its_alone_outputs(hf):
    params = SamplingParams(temperature=0.9, max_tokens=25, seed=11, ignore_eos=True)
    alone = [engine_outputs(_engine(hf, False), [prompt], params)[0] for prompt in PROMPTS]
    engine = _engine(hf, True)
    engine.add_request(PROMPTS[0], params, request_id="first")
    finished = []
    while engine.in_flight.queued is None:
        finished += engine.step()
    engine.add_request(PROMPTS[1], params, request_id="second")
    second = engine.requests["second"][1][0]
    assert [seq.request_id for seq in engine.in_flight.queued.batch.seqs] == ["first"]
    finished += engine.step()  # reads the queued window; queues none behind it, as a request waits
    assert engine.in_flight.queued is None and second.status == SequenceStatus.WAITING
    finished += engine.step()  # admits it
    assert engine.last_step_was_prefill and second.status == SequenceStatus.RUNNING
    engine.add_request(PROMPTS[2], params, request_id="third")
    while engine.has_unfinished_requests():
        finished += engine.step()
    by_id = {
        out.request_id: [(o.token_ids, o.finish_reason, o.log_probs, None) for o in out.outputs] for out in finished
    }
    assert_same_outputs([by_id["first"], by_id["second"], by_id["third"]], alone)
    _assert_all_blocks_free(engine)


@pytest.mark.timeout(120)
def test_aborting_a_request_in_a_queued_window_returns_its_partial_output_and_the_others_run_on(hf):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    expected = engine_outputs(_engine(hf, False), PROMPTS[1:], params)
    engine = _engine(hf, True)
    ids = [engine.add_request(prompt, params) for prompt in PROMPTS]
    while engine.in_flight.queued is None:
        engine.step()
    partial = engine.abort(ids[0])
    assert partial.outputs[0].finish_reason == "abort" and 0 < len(partial.outputs[0].token_ids) < 30
    finished = []
    while engine.has_unfinished_requests():
        finished += engine.step()
    outputs = {out.request_id: out for out in finished}
    actual = [[(o.token_ids, o.finish_reason, o.log_probs, None) for o in outputs[i].outputs] for i in ids[1:]]
    assert_same_outputs(actual, expected)
    assert ids[0] not in outputs
    _assert_all_blocks_free(engine)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("interruption", ["sleep", "load_weights"])
def test_sleep_or_a_weight_load_with_a_window_queued_drops_it_and_the_same_tokens_are_sampled_again(hf, interruption):
    expected = engine_outputs(_engine(hf, False), PROMPTS, SAMPLED)
    engine = _engine(hf, True)
    ids = [engine.add_request(prompt, p) for prompt, p in zip(PROMPTS, SAMPLED)]
    while engine.in_flight.queued is None:
        engine.step()
    if interruption == "sleep":
        engine.sleep()
        engine.wake()
    else:
        engine.load_weights(hf.state_dict().items())  # the same weights: the outputs must not change
    assert engine.in_flight.queued is None and engine.scheduler.num_preemptions == 4  # every sequence, recomputed
    finished = []
    while engine.has_unfinished_requests():
        finished += engine.step()
    outputs = {out.request_id: out for out in finished}
    actual = [[(o.token_ids, o.finish_reason, o.log_probs, o.raw_log_probs) for o in outputs[i].outputs] for i in ids]
    assert_same_outputs(actual, expected)
    _assert_all_blocks_free(engine)


@pytest.mark.timeout(120)
def test_a_kv_cache_too_small_to_queue_a_window_ahead_still_gives_the_same_outputs(hf):
    params = SamplingParams(temperature=0.8, max_tokens=24, seed=3, ignore_eos=True)
    expected = engine_outputs(_engine(hf, False, num_kv_blocks=14), PROMPTS * 2, params)
    small = _engine(hf, True, num_kv_blocks=14)
    assert_same_outputs(engine_outputs(small, PROMPTS * 2, params), expected)
    assert small.scheduler.num_preemptions > 0
    _assert_all_blocks_free(small)


def _running(scheduler: Scheduler, prompt_len: int, max_tokens: int, first_token: int) -> Sequence:
    """A sequence after its prefill: the prompt and one sampled token, the prompt's K/V cached."""
    seq = Sequence("r", list(range(first_token, first_token + prompt_len)), SamplingParams(max_tokens=max_tokens), 0)
    scheduler.add(seq)
    scheduler.schedule()
    seq.num_computed_tokens = seq.num_tokens
    seq.append(50, 0.0, None)
    return seq


def _scheduler(num_blocks: int) -> Scheduler:
    config = EngineConfig(block_size=4, max_model_len=64, num_kv_blocks=num_blocks, num_scheduler_steps=4)
    config.check_model_len(64)
    return Scheduler(config, BlockManager(num_blocks, 4))


def test_the_window_queued_behind_another_starts_after_its_tokens_and_leaves_out_rows_whose_budget_it_ends():
    scheduler = _scheduler(num_blocks=32)
    ending, going = _running(scheduler, 5, max_tokens=4, first_token=3), _running(scheduler, 5, 20, first_token=30)
    current = scheduler.schedule()
    assert current.step_counts == [3, 4]  # `ending` has 3 tokens left: this window is its last
    following = scheduler.schedule_next_window(current)
    assert following.seqs == [going] and following.pending == [4] and following.step_counts == [4]
    # `going` holds 6 tokens; the two windows feed positions 5..12, so its table covers 13 positions: 4 blocks.
    assert len(going.block_table) == 4 and len(ending.block_table) == 2


def test_a_prefill_is_queued_behind_another_only_while_waiting_sequences_can_be_admitted():
    scheduler = _scheduler(num_blocks=6)
    first = Sequence("a", list(range(3, 15)), SamplingParams(max_tokens=4), 0)  # 12 tokens: 3 blocks
    second = Sequence("b", list(range(30, 42)), SamplingParams(max_tokens=4), 0)
    third = Sequence("c", list(range(60, 72)), SamplingParams(max_tokens=4), 0)
    for seq in (first, second, third):
        scheduler.add(seq)
    scheduler.max_num_batched_tokens = 12  # one prompt per prefill
    assert scheduler.schedule().seqs == [first]
    assert scheduler.schedule_next_prefill().seqs == [second]  # its prefill needs nothing from the first's
    assert scheduler.schedule_next_prefill() is None  # no free blocks left for the third
    assert list(scheduler.waiting) == [third]


def test_nothing_is_queued_ahead_while_a_sequence_waits_or_the_free_blocks_cannot_hold_both_windows():
    waiting = _scheduler(num_blocks=32)
    current = ScheduledBatch([_running(waiting, 5, 20, first_token=3)], False, 4, [4])
    waiting.add(Sequence("later", [1, 2, 3], SamplingParams(), 0))
    assert waiting.schedule_next_window(current) is None
    short = _scheduler(num_blocks=3)
    seq = _running(short, 7, 20, first_token=3)  # 8 tokens in 2 blocks
    current = short.schedule()  # positions 7..10: the third block, the last free one
    assert current.seqs == [seq] and current.num_steps == 4 and short.block_manager.num_free_blocks == 0
    assert short.schedule_next_window(current) is None  # positions 11..14 would need a fourth
    assert len(seq.block_table) == 3
