"""LLMEngine end to end on tiny models: greedy equals transformers, log-probs equal a full forward, prefix sharing,
continuous batching, preemption, stop conditions, seeds, weight updates, sleep/wake and bad input."""

from __future__ import annotations

import pytest
import torch

from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine

from .engine_testkit import hf_greedy, make_tiny_hf_model

PROMPTS = [[5, 9, 13, 17, 21, 3, 7, 8, 9], [11, 4, 8], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _engine(hf, **overrides) -> LLMEngine:
    settings = dict(block_size=4, max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=64)
    settings.update(overrides)
    return LLMEngine(hf, EngineConfig(**settings))


def _tokens(outputs) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


@pytest.mark.timeout(120)
def test_greedy_generation_equals_transformers_greedy_for_each_family(family):
    hf = make_tiny_hf_model(family)
    outputs = _engine(hf).generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outputs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 12)
        assert out.outputs[0].finish_reason == "length"


def test_sampled_log_probs_equal_the_log_softmax_of_a_full_forward():
    hf = make_tiny_hf_model("llama")
    params = SamplingParams(temperature=0.7, max_tokens=10, seed=3, ignore_eos=True, raw_log_probs=True)
    out = _engine(hf).generate([PROMPTS[0]], params)[0].outputs[0]
    full = torch.tensor([PROMPTS[0] + out.token_ids])
    with torch.no_grad():
        logits = hf(full).logits[0, len(PROMPTS[0]) - 1 : -1]
    targets = torch.tensor(out.token_ids).unsqueeze(1)
    expected = (logits / 0.7).log_softmax(-1).gather(1, targets).squeeze(1)
    expected_raw = logits.log_softmax(-1).gather(1, targets).squeeze(1)
    torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.tensor(out.raw_log_probs), expected_raw, atol=1e-4, rtol=1e-4)


def test_prefix_sharing_on_and_off_give_identical_greedy_outputs_and_samples_share_prompt_blocks():
    hf = make_tiny_hf_model("qwen2")
    prompts = [PROMPTS[2], [*PROMPTS[2][:9], 1, 2, 3], PROMPTS[2]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, n=3)
    shared = _engine(hf, enable_prefix_caching=True)
    on = shared.generate(prompts, params)
    off = _engine(hf, enable_prefix_caching=False).generate(prompts, params)
    assert [[o.token_ids for o in r.outputs] for r in on] == [[o.token_ids for o in r.outputs] for r in off]
    # 3 requests x n=3 over the same 8-token prefix: the prefix is computed once, so few blocks were ever used.
    sharer = _engine(hf, enable_prefix_caching=True)
    sharer.add_request(PROMPTS[2], SamplingParams(n=4, max_tokens=1))
    seqs = sharer.scheduler.schedule().seqs
    first_blocks = {tuple(seq.block_table[:3]) for seq in seqs}
    assert len(first_blocks) == 1 and [seq.num_computed_tokens for seq in seqs] == [0, 12, 12, 12]


def test_requests_added_mid_flight_give_the_same_greedy_outputs_as_alone():
    hf = make_tiny_hf_model("mistral")
    engine = _engine(hf)
    alone = _tokens(engine.generate(PROMPTS, GREEDY))
    engine.add_request(PROMPTS[0], GREEDY, "a")
    results = {}
    for step in range(200):
        if step == 3:
            engine.add_request(PROMPTS[1], GREEDY, "b")
        if step == 7:
            engine.add_request(PROMPTS[2], GREEDY, "c")
        results.update({r.request_id: r.outputs[0].token_ids for r in engine.step()})
        if len(results) == 3:
            break
    assert [results["a"], results["b"], results["c"]] == alone


def test_a_kv_cache_too_small_for_the_batch_completes_by_preemption():
    hf = make_tiny_hf_model("qwen3")
    expected = _tokens(_engine(hf).generate(PROMPTS * 2, GREEDY))
    small = _engine(hf, num_kv_blocks=8)
    assert _tokens(small.generate(PROMPTS * 2, GREEDY)) == expected
    assert small.scheduler.num_preemptions > 0


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch():
    hf = make_tiny_hf_model("llama")
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, max_tokens=10, seed=7, ignore_eos=True)
    alone = _engine(hf).generate([PROMPTS[0]], params)[0].outputs[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=5, seed=1, ignore_eos=True)
    batched = _engine(hf).generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], [other, params, other])
    assert batched[1].outputs[0].token_ids == alone
    reseeded = _engine(hf).generate([PROMPTS[0]], SamplingParams(**{**params.__dict__, "seed": 8}))
    assert reseeded[0].outputs[0].token_ids != alone


def test_n_samples_of_one_request_differ_and_stop_at_max_tokens():
    hf = make_tiny_hf_model("llama")
    out = _engine(hf).generate([PROMPTS[0]], SamplingParams(n=4, temperature=1.0, max_tokens=6, ignore_eos=True))[0]
    assert len(out.outputs) == 4 and all(len(o.token_ids) == 6 for o in out.outputs)
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1


def test_generation_stops_at_a_stop_token_and_at_eos_unless_ignored():
    hf = make_tiny_hf_model("llama")
    engine = _engine(hf)
    engine.eos_token_ids = set()
    greedy = engine.generate([PROMPTS[0]], GREEDY)[0].outputs[0].token_ids
    stop_at = greedy[4]
    cut = greedy.index(stop_at) + 1
    stopped = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at]))
    assert stopped[0].outputs[0].token_ids == greedy[:cut] and stopped[0].outputs[0].finish_reason == "stop"
    engine.eos_token_ids = {stop_at}
    eos = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=12))[0].outputs[0]
    assert eos.token_ids == greedy[:cut] and eos.finish_reason == "stop"
    last = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=cut))[0].outputs[0]
    assert last.token_ids == greedy[:cut] and last.finish_reason == "stop"  # a stop on the last allowed token
    engine.eos_token_ids = set()
    short = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=cut - 1))[0].outputs[0]
    assert short.token_ids == greedy[: cut - 1] and short.finish_reason == "length"


def test_outputs_follow_the_new_weights_after_load_weights():
    old, new = make_tiny_hf_model("qwen2", seed=0), make_tiny_hf_model("qwen2", seed=1)
    engine = _engine(old)
    before = _tokens(engine.generate(PROMPTS, GREEDY))
    engine.load_weights(new.state_dict().items())
    after = _tokens(engine.generate(PROMPTS, GREEDY))
    assert after != before
    assert after == [hf_greedy(new, p, 12) for p in PROMPTS]


def test_sleep_frees_the_kv_cache_and_wake_restores_generation():
    hf = make_tiny_hf_model("qwen2")
    engine = _engine(hf)
    expected = _tokens(engine.generate(PROMPTS, GREEDY))
    engine.sleep()
    assert not engine.runner.kv_cache.allocated
    engine.wake()
    assert _tokens(engine.generate(PROMPTS, GREEDY)) == expected
    engine.close()  # what tensor-parallel engines do before their process group goes
    assert not engine.runner.kv_cache.allocated
    with pytest.raises(RuntimeError, match="engine is asleep"):
        engine.generate(PROMPTS, GREEDY)
    engine.wake()
    assert _tokens(engine.generate(PROMPTS, GREEDY)) == expected


def test_bad_requests_raise_clear_errors_and_the_engine_keeps_serving():
    hf = make_tiny_hf_model("llama")
    engine = _engine(hf)
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request([], GREEDY)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(list(range(3, 67)), GREEDY)
    with pytest.raises(ValueError, match=r"unknown sampling parameter 'temprature'.*temperature"):
        engine.add_request([3, 4], {"temprature": 0.5})
    with pytest.raises(ValueError, match="token ids must be in"):
        engine.add_request([3, 4000], GREEDY)
    assert _tokens(engine.generate([PROMPTS[0]], GREEDY)) == [hf_greedy(hf, PROMPTS[0], 12)]


def test_abort_ends_a_request_with_finish_reason_abort():
    hf = make_tiny_hf_model("llama")
    engine = _engine(hf)
    engine.add_request(PROMPTS[0], GREEDY, "x")
    engine.step()  # prefill: one token
    engine.step()  # a decode window
    out = engine.abort("x")
    assert out.outputs[0].finish_reason == "abort"
    assert len(out.outputs[0].token_ids) == 1 + engine.config.num_scheduler_steps
    assert not engine.has_unfinished_requests() and engine.block_manager.num_free_blocks == 64


def test_generation_stops_at_a_stop_string_when_the_engine_has_a_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from hyflow.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path, arch="llama", max_position_embeddings=64)
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = LLMEngine(path, EngineConfig(block_size=4, num_kv_blocks=64), tokenizer)
    prompt = tokenizer.encode("12+34=", add_special_tokens=False)
    free = engine.generate([prompt], GREEDY)[0].outputs[0]
    stop = tokenizer.decode(free.token_ids[3:5])
    stopped = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]))
    out = stopped[0].outputs[0]
    assert out.finish_reason == "stop" and stop in out.text and len(out.token_ids) <= 5
    assert out.token_ids == free.token_ids[: len(out.token_ids)]
    with pytest.raises(ValueError, match="need a tokenizer"):
        _engine(make_tiny_hf_model("llama")).add_request([3, 4], SamplingParams(stop=["x"]))


def test_a_batch_with_one_bad_prompt_queues_nothing():
    engine = _engine(make_tiny_hf_model("llama"))
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.generate([PROMPTS[0], []], GREEDY)
    assert not engine.has_unfinished_requests() and not engine.requests


def test_the_kv_cache_holds_no_more_blocks_than_max_num_seqs_full_length_sequences_can_fill():
    config = EngineConfig(block_size=4, max_model_len=30, max_num_seqs=3, kv_cache_bytes=2**30, device="cpu")
    engine = LLMEngine(make_tiny_hf_model("qwen2"), config)
    assert engine.block_manager.num_blocks == 3 * 8  # ceil(30 / 4) blocks each; the byte budget allows far more
