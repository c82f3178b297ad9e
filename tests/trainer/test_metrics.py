"""Per-step metrics: data statistics against naive loops, timings, throughput, and the timer."""

import time

import numpy as np
import pytest
import torch

from hyflow import fields as F
from hyflow.protocol import DataProto
from hyflow.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    reduce_metrics,
    staleness_metrics,
    timer,
)

PROMPT_WIDTH, RESPONSE_WIDTH = 4, 5


def _batch() -> DataProto:
    generator = torch.Generator().manual_seed(1)
    prompt_lens, response_lens = [4, 2, 3], [5, 1, 3]
    rows = len(prompt_lens)
    attention = torch.zeros(rows, PROMPT_WIDTH + RESPONSE_WIDTH, dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        attention[row, PROMPT_WIDTH - p : PROMPT_WIDTH] = 1
        attention[row, PROMPT_WIDTH : PROMPT_WIDTH + r] = 1
    response_mask = attention[:, PROMPT_WIDTH:].clone()
    response_mask[0, 2] = 0  # a tool token inside the first response
    tensors = {
        F.RESPONSES: torch.zeros(rows, RESPONSE_WIDTH, dtype=torch.long),
        F.ATTENTION_MASK: attention,
        F.RESPONSE_MASK: response_mask,
        F.TOKEN_LEVEL_SCORES: torch.rand(rows, RESPONSE_WIDTH, generator=generator),
        F.TOKEN_LEVEL_REWARDS: torch.rand(rows, RESPONSE_WIDTH, generator=generator),
        F.ADVANTAGES: torch.randn(rows, RESPONSE_WIDTH, generator=generator),
        F.RETURNS: torch.randn(rows, RESPONSE_WIDTH, generator=generator),
        F.VALUES: torch.randn(rows, RESPONSE_WIDTH, generator=generator),
    }
    non_tensors = {F.NUM_TURNS: np.array([2, 4, 3], dtype=object)}
    return DataProto.from_dict(tensors, non_tensors)


def _naive_valid(batch: DataProto, key: str) -> list[float]:
    values, mask = batch.batch[key].tolist(), batch.batch[F.RESPONSE_MASK].tolist()
    return [v for row, m_row in zip(values, mask) for v, m in zip(row, m_row) if m == 1]


def test_data_metrics_match_naive_statistics_over_valid_tokens():
    batch = _batch()
    metrics = compute_data_metrics(batch, use_critic=True)
    scores = [sum(row) for row in batch.batch[F.TOKEN_LEVEL_SCORES].tolist()]
    assert metrics["critic/score/mean"] == pytest.approx(np.mean(scores))
    assert metrics["critic/score/max"] == pytest.approx(max(scores))
    rewards = [sum(row) for row in batch.batch[F.TOKEN_LEVEL_REWARDS].tolist()]
    assert metrics["critic/rewards/min"] == pytest.approx(min(rewards))
    for key in (F.ADVANTAGES, F.RETURNS, F.VALUES):
        valid = _naive_valid(batch, key)
        assert metrics[f"critic/{key}/mean"] == pytest.approx(np.mean(valid), abs=1e-6)
        assert metrics[f"critic/{key}/max"] == pytest.approx(max(valid))
        assert metrics[f"critic/{key}/min"] == pytest.approx(min(valid))
    returns, values = np.array(_naive_valid(batch, F.RETURNS)), np.array(_naive_valid(batch, F.VALUES))
    explained = 1 - np.var(returns - values) / (np.var(returns) + 1e-5)
    assert metrics["critic/vf_explained_var"] == pytest.approx(explained, rel=1e-4)


def test_length_metrics_count_real_tokens_and_the_rows_clipped_at_max_length():
    metrics = compute_data_metrics(_batch(), use_critic=False)
    assert metrics["response_length/mean"] == pytest.approx(3.0)
    assert metrics["response_length/max"] == 5.0
    assert metrics["response_length/min"] == 1.0
    assert metrics["response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert metrics["prompt_length/mean"] == pytest.approx(3.0)
    assert metrics["prompt_length/clip_ratio"] == pytest.approx(1 / 3)
    assert metrics["num_turns/max"] == 4.0
    assert "critic/values/mean" not in metrics


def test_data_metrics_skip_fields_the_batch_does_not_hold_yet():
    batch = _batch()
    batch.pop(batch_keys=[F.ADVANTAGES, F.RETURNS, F.VALUES, F.TOKEN_LEVEL_REWARDS])
    metrics = compute_data_metrics(batch, use_critic=True)
    assert "critic/score/mean" in metrics
    assert not any(key.startswith(("critic/advantages", "critic/values", "critic/rewards")) for key in metrics)


def test_timing_metrics_divide_generation_by_response_tokens_and_updates_by_all_tokens():
    timing = {"gen": 0.9, "update_actor": 1.5, "reward": 0.2}
    metrics = compute_timing_metrics(_batch(), timing)
    assert metrics["timing_s/reward"] == 0.2
    assert metrics["timing_per_token_ms/gen"] == pytest.approx(1000 * 0.9 / 9)
    assert metrics["timing_per_token_ms/update_actor"] == pytest.approx(1000 * 1.5 / 18)
    assert "timing_per_token_ms/reward" not in metrics


def test_throughput_is_tokens_per_second_per_device():
    metrics = compute_throughput_metrics(_batch(), {"step": 2.0}, n_devices=3)
    assert metrics["perf/total_num_tokens"] == 18
    assert metrics["perf/throughput"] == pytest.approx(18 / 2.0 / 3)


def test_throughput_without_a_step_time_says_how_to_time_the_step():
    with pytest.raises(ValueError, match="timer\\('step'"):
        compute_throughput_metrics(_batch(), {"gen": 1.0}, n_devices=1)


def test_timer_adds_the_time_of_each_block_to_its_stage():
    timing: dict[str, float] = {}
    with timer("gen", timing):
        time.sleep(0.01)
    first = timing["gen"]
    with timer("gen", timing):
        time.sleep(0.01)
    assert first >= 0.01
    assert timing["gen"] >= first + 0.01


def test_timer_records_the_time_even_when_the_block_raises():
    timing: dict[str, float] = {}
    with pytest.raises(RuntimeError), timer("reward", timing):
        raise RuntimeError("boom")
    assert "reward" in timing


def test_worker_metrics_are_reduced_to_their_mean_per_name():
    reduced = reduce_metrics({"actor/pg_loss": [0.5, 1.5, 1.0], "actor/lr": 1e-6, "critic/vf_loss": []})
    assert reduced == {"actor/pg_loss": pytest.approx(1.0), "actor/lr": 1e-6}


def test_staleness_metrics_are_the_histogram_of_samples_and_tokens_behind_the_trained_weights():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])  # 3, 1, 2, 4 tokens
    metrics = staleness_metrics([5, 4, 4, 3], mask, trainer_version=5)  # staleness 0, 1, 1, 2

    assert metrics["async/staleness_mean"] == pytest.approx(1.0)
    assert metrics["async/staleness_max"] == 2.0
    assert metrics["async/samples_staleness_0"] == pytest.approx(0.25)
    assert metrics["async/samples_staleness_1"] == pytest.approx(0.5)
    assert metrics["async/tokens_staleness_1"] == pytest.approx(3 / 10)
    assert metrics["async/tokens_staleness_2"] == pytest.approx(4 / 10)
    assert "async/samples_staleness_3" not in metrics
