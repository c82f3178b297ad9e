"""Multi-step decode (EngineConfig.num_scheduler_steps): a window of K decode steps gives exactly the outputs of K
single steps — greedy and seeded sampling, n > 1, log-probs, stops landing mid-window, a small KV cache, requests
joining mid-run — and the device-side `advance` matches its definition."""

from __future__ import annotations

import asyncio

import pytest
import torch

from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.block_manager import BlockManager
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.cuda_graphs import DecodeGraphs
from hyflow.engine.decode_state import DecodeState
from hyflow.engine.engine import LLMEngine
from hyflow.engine.multi_step import advance
from hyflow.engine.sampler import SamplingTensors
from hyflow.engine.scheduler import Scheduler
from hyflow.engine.sequence import Sequence

from .engine_testkit import assert_same_outputs, engine_outputs, make_tiny_hf_model

PROMPTS = [[5, 9, 13, 17, 21, 3, 7, 8, 9], [11, 4, 8], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def hf() -> torch.nn.Module:
    return make_tiny_hf_model("qwen2")


def _engine(hf, steps: int, **overrides) -> LLMEngine:
    settings = dict(block_size=4, max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=64)
    settings.update(overrides)
    return LLMEngine(hf, EngineConfig(num_scheduler_steps=steps, **settings))


@pytest.mark.timeout(120)
def test_greedy_windows_equal_single_steps_with_eos_stop_ids_and_max_tokens_landing_mid_window(hf):
    free = engine_outputs(_engine(hf, 1), PROMPTS, GREEDY)
    # Output index 0 comes from the prefill, then windows of 8 cover indices 1-8, 9-16: stop inside them.
    stop_token, eos_token = free[0][0][0][4], free[1][0][0][11]
    params = [
        SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0, max_tokens=20),
        SamplingParams(temperature=0, max_tokens=6),
    ]
    runs = {}
    for steps in (1, 3, 8):
        engine = _engine(hf, steps)
        engine.eos_token_ids = {eos_token}
        runs[steps] = engine_outputs(engine, PROMPTS, params)
    assert_same_outputs(runs[3], runs[1])
    assert_same_outputs(runs[8], runs[1])
    lengths = [len(r[0][0]) for r in runs[1]]
    assert [r[0][1] for r in runs[1]] == ["stop", "stop", "length"] and lengths[2] == 6
    assert lengths[0] <= 5 and lengths[1] <= 12 and all((n - 1) % 8 for n in lengths)  # not a window's last token


@pytest.mark.timeout(120)
def test_seeded_sampling_with_n_samples_and_log_probs_is_the_same_in_windows_and_single_steps(hf):
    params = [
        SamplingParams(n=3, temperature=1.0, max_tokens=17, seed=5, ignore_eos=True, raw_log_probs=True),
        SamplingParams(n=2, temperature=0.7, top_k=20, top_p=0.9, max_tokens=11, seed=9, ignore_eos=True),
        SamplingParams(temperature=1.3, max_tokens=4, seed=1),
    ]
    single = engine_outputs(_engine(hf, 1), PROMPTS, params)
    multi = engine_outputs(_engine(hf, 8), PROMPTS, params)
    assert_same_outputs(multi, single)
    assert len({tuple(sample[0]) for sample in single[0]}) > 1  # the n samples differ


@pytest.mark.timeout(120)
def test_a_stop_string_completed_mid_window_ends_the_sequence_as_in_single_steps(tmp_path):
    from transformers import AutoTokenizer

    from hyflow.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path, arch="llama", max_position_embeddings=64)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt = tokenizer.encode("12+34=", add_special_tokens=False)
    engines = {
        steps: LLMEngine(path, EngineConfig(block_size=4, num_kv_blocks=64, num_scheduler_steps=steps), tokenizer)
        for steps in (1, 8)
    }
    free = engines[1].generate([prompt], GREEDY)[0].outputs[0]
    stop = tokenizer.decode(free.token_ids[3:5])
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop])
    single, multi = (engines[steps].generate([prompt], params)[0].outputs[0] for steps in (1, 8))
    assert multi.finish_reason == single.finish_reason == "stop" and len(single.token_ids) <= 5
    assert (multi.token_ids, multi.text) == (single.token_ids, single.text)


@pytest.mark.timeout(120)
def test_a_kv_cache_too_small_for_full_windows_still_gives_the_single_stepengine_outputs(hf):
    params = SamplingParams(temperature=0.8, max_tokens=24, seed=3, ignore_eos=True)
    expected = engine_outputs(_engine(hf, 1), PROMPTS * 2, params)
    small = _engine(hf, 8, num_kv_blocks=14)
    assert_same_outputs(engine_outputs(small, PROMPTS * 2, params), expected)
    assert small.scheduler.num_preemptions > 0


@pytest.mark.timeout(120)
def test_async_requests_joining_during_windows_match_their_alone_runs(hf):
    params = [SamplingParams(temperature=0.9, max_tokens=10 + 5 * i, seed=i, ignore_eos=True) for i in range(3)]
    alone = [engine_outputs(_engine(hf, 1), [prompt], [p])[0] for prompt, p in zip(PROMPTS, params)]
    async_engine = AsyncLLMEngine(_engine(hf, 8))

    async def main():
        async def one(i):
            await asyncio.sleep(0.02 * i)  # arrive while the others are in their windows
            return await async_engine.generate(PROMPTS[i], params[i], request_id=f"r{i}")

        return await asyncio.gather(*(one(i) for i in range(3)))

    outputs = asyncio.run(main())
    joined = [[(o.token_ids, o.finish_reason, o.log_probs, o.raw_log_probs) for o in r.outputs] for r in outputs]
    assert_same_outputs(joined, alone)


def _follow_up_turn(engine: LLMEngine, tokens: list[int]) -> tuple[int, list[list[tuple]]]:
    """Generates from `tokens` + 2 more; returns how many prompt tokens were found in the cache, and the outputs."""
    computed_at_prefill = []
    launch_step = engine.runner.launch_step

    def recording_launch(batch):
        computed_at_prefill.append(batch.seqs[0].num_computed_tokens)
        return launch_step(batch)

    engine.runner.launch_step = recording_launch
    outputs = engine_outputs(engine, [[*tokens, 5, 6]], GREEDY)
    return computed_at_prefill[0], outputs


def test_windows_register_the_same_prefix_blocks_as_single_steps_and_a_follow_up_turn_reuses_them(hf):
    # The last request stops first and idles to the end of its last window; 13 + 20 - 1 = 32 tokens computed.
    longer = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    params = [longer, longer, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)]
    hashes, follow_ups = {}, {}
    for steps in (1, 8):
        engine = _engine(hf, steps)
        outputs = engine.generate(PROMPTS, params)
        hashes[steps] = set(engine.block_manager.hash_to_block_id)
        # A follow-up turn (prompt + response + more) finds the response's blocks in the cache.
        cached, follow_ups[steps] = _follow_up_turn(engine, PROMPTS[2] + outputs[2].outputs[0].token_ids)
        assert cached == 32  # 8 full blocks of 4
    assert hashes[8] == hashes[1]
    assert_same_outputs(follow_ups[8], follow_ups[1])


class EagerGraph:
    """Stands in for a CUDA graph on CPU: `replay()` runs the recorded function again."""

    def __init__(self, fn, out) -> None:
        self.fn, self.out = fn, out

    def replay(self) -> None:
        result = self.fn()
        if self.out is not None:
            self.out.copy_(result)


class EagerDecodeGraphs(DecodeGraphs):
    """DecodeGraphs with eager replays, to test its static buffers, padding and buckets without a GPU."""

    def _record(self, fn, prepare=lambda: None):
        prepare()
        out = fn()
        prepare()
        return EagerGraph(fn, out), out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("full_width_tables", [False, True], ids=["power-of-two-blocks", "full-width-blocks"])
def test_the_graph_path_buffers_and_padding_give_the_single_stepengine_outputs(hf, full_width_tables):
    params = [
        SamplingParams(n=2, temperature=1.0, max_tokens=30, seed=4, ignore_eos=True, raw_log_probs=True),
        SamplingParams(temperature=0, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=10, max_tokens=26, seed=2, ignore_eos=True),
    ]
    expected = engine_outputs(_engine(hf, 1), PROMPTS, params)
    engine = _engine(hf, 8)
    engine.runner.graphs = graphs = EagerDecodeGraphs(
        engine.runner.forward, engine.runner.kv_cache, engine.config, engine.device
    )
    graphs.full_width_tables = full_width_tables
    assert_same_outputs(engine_outputs(engine, PROMPTS, params), expected)
    # 4 rows, then 3 padded to 4 (the greedy one finished) for three windows in a row, which reuse the loaded
    # sampling settings; the block tables grow through two buckets, or stay in one at the full width. Top-k and
    # raw log-probs are on throughout.
    assert {key[0] for key in graphs.window_graphs} == {4}
    assert len(graphs.window_graphs) == (1 if full_width_tables else 2)
    assert all(key[2:] == (True, True, False) for key in graphs.window_graphs)  # no image rows: no rotary shift


def test_advance_feeds_the_sampled_tokens_at_the_next_positions_and_parks_idle_rows_on_scratch():
    block_size, scratch_slot = 4, 99 * 4
    tables = torch.tensor([[7, 3, 5], [2, 6, 0]])
    positions = torch.tensor([7, 2])
    state = DecodeState(
        input_ids=torch.tensor([1, 1]),
        positions=positions.clone(),
        slot_mapping=torch.tensor([3 * 4 + 3, 2 * 4 + 2]),
        block_tables=tables,
        steps_left=torch.tensor([2, 0]),  # row 0 takes part in two more steps, row 1 in none
        sampling=SamplingTensors(
            torch.zeros(2),
            torch.zeros(2, dtype=torch.long),
            torch.ones(2),
            torch.zeros(2, dtype=torch.long),
            torch.tensor([4, 0]),
            False,
            False,
        ),
        step=torch.zeros(1, dtype=torch.long),
        tokens=torch.zeros(2, 3, dtype=torch.long),
        log_probs=torch.zeros(2, 3),
        raw_log_probs=None,
        rows=torch.arange(2),
    )
    advance(state, torch.tensor([42, 43]), block_size, scratch_slot)
    # Row 0 moves to position 8 = block index 2 (block 5), offset 0; row 1 stays at 2 and writes to scratch.
    assert state.input_ids.tolist() == [42, 43] and state.positions.tolist() == [8, 2]
    assert state.slot_mapping.tolist() == [5 * 4 + 0, scratch_slot]
    assert state.sampling.counters.tolist() == [5, 1] and state.step.tolist() == [1]
    assert state.steps_left.tolist() == [1, -1]


def _scheduler(num_blocks: int, steps: int) -> Scheduler:
    config = EngineConfig(block_size=4, max_model_len=32, num_kv_blocks=num_blocks, num_scheduler_steps=steps)
    config.check_model_len(32)
    return Scheduler(config, BlockManager(num_blocks, 4))


def _running(scheduler: Scheduler, prompt_len: int, max_tokens: int, first_token: int = 3) -> Sequence:
    """A sequence after its prefill: the prompt and one sampled token, the prompt's K/V cached."""
    prompt = list(range(first_token, first_token + prompt_len))
    seq = Sequence("r", prompt, SamplingParams(max_tokens=max_tokens), seed=0)
    scheduler.add(seq)
    scheduler.schedule()
    seq.num_computed_tokens = seq.num_tokens
    seq.append(50, 0.0, None)
    return seq


def test_a_window_is_as_long_as_the_largest_token_budget_and_each_row_runs_its_own_budget():
    scheduler = _scheduler(num_blocks=32, steps=8)
    short, long = _running(scheduler, 5, max_tokens=3), _running(scheduler, 5, max_tokens=30, first_token=30)
    batch = scheduler.schedule()
    assert batch.seqs == [short, long] and batch.num_steps == 8 and batch.step_counts == [2, 8]
    # Slots for the K/V of every fed token: positions 5..6 for the short row, 5..12 for the long one.
    assert scheduler.block_manager.num_free_blocks == 32 - 6
    assert len(short.block_table) == 2 and len(long.block_table) == 4
    capped = _scheduler(num_blocks=32, steps=8)
    _running(capped, 27, max_tokens=30)  # max_model_len 32: 28 tokens now, 4 more allowed
    assert capped.schedule().num_steps == 4


def test_a_window_shrinks_to_the_free_blocks_and_falls_back_to_a_single_step():
    scheduler = _scheduler(num_blocks=5, steps=8)
    first, second = _running(scheduler, 8, 20), _running(scheduler, 8, 20, first_token=30)
    # 4 blocks are taken (2 each) and one is free; a window of 2+ steps needs a new block for each row, so it
    # shrinks to a single step, which gives the block to the first row and preempts the second.
    batch = scheduler.schedule()
    assert batch.num_steps == 1 and scheduler.num_preemptions == 1 and batch.seqs == [first]
    grown = _scheduler(num_blocks=6, steps=8)
    _running(grown, 8, 20), _running(grown, 8, 20, first_token=30)
    assert grown.schedule().num_steps == 4  # two free blocks: one each, positions 8..11
    assert len(first.block_table) == 3 and second.block_table == []
