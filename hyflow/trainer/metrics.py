"""Per-step metrics the controller logs: data statistics, stage timings and throughput, with verl's key names.

    timing = {}
    with timer("gen", timing):
        batch = generate(batch)
    metrics = {}
    metrics.update(compute_data_metrics(batch, use_critic=True))
    metrics.update(compute_timing_metrics(batch, timing))
    metrics.update(compute_throughput_metrics(batch, timing, n_devices=8))
    metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))   # worker lists → means

Every statistic is computed as a tensor and the whole set is moved to the host in one `.tolist()` (one sync per
call, named in `_to_floats`). Lengths come from the attention mask, so tool and user tokens inside a multi-turn
response count toward `response_length`, while scores, advantages and returns are taken over `response_mask`
(model tokens). The FLOPs/MFU estimate lives in `flops.py`.

Shape legend: B = rows (responses), P = prompt length, R = response length.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from hyflow import fields as F
from hyflow.protocol import DataProto

__all__ = [
    "compute_data_metrics",
    "compute_throughput_metrics",
    "compute_timing_metrics",
    "reduce_metrics",
    "staleness_metrics",
    "throughput_metrics_for_tokens",
    "timer",
    "timing_metrics_for_tokens",
]

# Stages whose time is divided by the response tokens (generation) or by all tokens (the rest) per-token metrics.
_PER_RESPONSE_TOKEN_STAGES = ("gen",)
_PER_TOKEN_STAGES = ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")


@contextmanager
def timer(name: str, timing: dict[str, float]) -> Iterator[None]:
    """Add the wall-clock seconds spent in the block to `timing[name]` (summed when a stage runs twice).

    It does not synchronise CUDA: the controller's calls to worker groups block until the workers are done.
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def reduce_metrics(metrics: Mapping[str, Sequence[float] | float]) -> dict[str, float]:
    """The mean of each metric's values, e.g. a worker's `{"actor/pg_loss": [one per optimizer step]}`.

    A single number passes through; nested lists (one list per rank, as `DataProto.concat` gathers them) are
    flattened first; an empty list is dropped (the stage did not run).
    """
    reduced = {}
    for name, values in metrics.items():
        if isinstance(values, int | float | np.number):
            reduced[name] = float(values)
            continue
        flat = np.concatenate([np.ravel(np.asarray(v, dtype=float)) for v in values]) if len(values) else []
        if len(flat) > 0:
            reduced[name] = float(np.mean(flat))
    return reduced


def _to_floats(stats: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """One host sync for the whole dict: stack the 0-d tensors and read them back together."""
    if not stats:
        return {}
    values = torch.stack([value.detach().float().reshape(()).cpu() for value in stats.values()]).tolist()
    return dict(zip(stats.keys(), values))


def _mean_max_min(prefix: str, values: torch.Tensor) -> dict[str, torch.Tensor]:
    """`{prefix}/mean|max|min` of a 1-D tensor; zeros when it is empty (a batch with no valid tokens)."""
    if values.numel() == 0:
        values = torch.zeros(1)
    values = values.float()
    return {f"{prefix}/mean": values.mean(), f"{prefix}/max": values.max(), f"{prefix}/min": values.min()}


def _lengths(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(prompt lengths (B,), response lengths (B,), P, R) from the attention mask."""
    response_width = batch.batch[F.RESPONSES].shape[-1]
    attention_mask = batch.batch[F.ATTENTION_MASK]
    prompt_width = attention_mask.shape[-1] - response_width
    prompt_length = attention_mask[:, :prompt_width].sum(-1).float()
    response_length = attention_mask[:, prompt_width:].sum(-1).float()
    return prompt_length, response_length, prompt_width, response_width


def _length_stats(batch: DataProto) -> dict[str, torch.Tensor]:
    prompt_length, response_length, prompt_width, response_width = _lengths(batch)
    stats = _mean_max_min("response_length", response_length)
    stats["response_length/clip_ratio"] = (response_length >= response_width).float().mean()
    stats.update(_mean_max_min("prompt_length", prompt_length))
    stats["prompt_length/clip_ratio"] = (prompt_length >= prompt_width).float().mean()
    return stats


def _explained_variance(returns: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """1 − Var(returns − values) / Var(returns), over valid tokens: 1 is a perfect critic, ≤ 0 a useless one."""
    return 1.0 - torch.var(returns - values, unbiased=False) / (torch.var(returns, unbiased=False) + 1e-5)


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, float]:
    """Statistics of one training batch, with verl's keys.

    - `critic/score/{mean,max,min}`: per-sequence task score, Σ_t token_level_scores
    - `critic/rewards/{mean,max,min}`: per-sequence reward after the KL penalty, Σ_t token_level_rewards
    - `critic/advantages/...`, `critic/returns/...`: over the model tokens (response_mask = 1)
    - `critic/values/...` and `critic/vf_explained_var` when `use_critic`
    - `response_length/{mean,max,min,clip_ratio}`, `prompt_length/...`: clip_ratio is the fraction of rows that
      fill their whole width (a response cut at max_response_length, or a prompt at max_prompt_length)
    - `num_turns/{mean,max,min}` when the agent loop recorded `num_turns`

    Fields that the batch does not hold yet are skipped.
    """
    keys = set(batch.batch.keys())
    valid = batch.batch[F.RESPONSE_MASK].bool() if F.RESPONSE_MASK in keys else None
    stats: dict[str, torch.Tensor] = {}
    if F.TOKEN_LEVEL_SCORES in keys:
        stats.update(_mean_max_min("critic/score", batch.batch[F.TOKEN_LEVEL_SCORES].sum(-1)))
    if F.TOKEN_LEVEL_REWARDS in keys:
        stats.update(_mean_max_min("critic/rewards", batch.batch[F.TOKEN_LEVEL_REWARDS].sum(-1)))
    if valid is not None:
        for key in (F.ADVANTAGES, F.RETURNS):
            if key in keys:
                stats.update(_mean_max_min(f"critic/{key}", batch.batch[key][valid]))
        if use_critic and F.VALUES in keys:
            values = batch.batch[F.VALUES][valid]
            stats.update(_mean_max_min("critic/values", values))
            if F.RETURNS in keys:
                stats["critic/vf_explained_var"] = _explained_variance(batch.batch[F.RETURNS][valid], values)
    if F.RESPONSES in keys and F.ATTENTION_MASK in keys:
        stats.update(_length_stats(batch))
    if F.NUM_TURNS in batch.non_tensor_batch:
        turns = torch.as_tensor(batch.non_tensor_batch[F.NUM_TURNS].astype(np.float64))
        stats.update(_mean_max_min("num_turns", turns))
    return _to_floats(stats)


def _token_counts(batch: DataProto) -> tuple[int, int]:
    """(response tokens, all tokens) of the batch, from the attention mask (one host sync)."""
    prompt_length, response_length, _, _ = _lengths(batch)
    response_tokens, prompt_tokens = torch.stack([response_length.sum(), prompt_length.sum()]).tolist()
    return int(response_tokens), int(response_tokens + prompt_tokens)


def compute_timing_metrics(batch: DataProto, timing: Mapping[str, float]) -> dict[str, float]:
    """`timing_s/<stage>` for every timed stage, and `timing_per_token_ms/<stage>` for the model stages
    (`timing_metrics_for_tokens`, with the batch's token counts)."""
    response_tokens, all_tokens = _token_counts(batch)
    return timing_metrics_for_tokens(timing, response_tokens, all_tokens)


def timing_metrics_for_tokens(timing: Mapping[str, float], response_tokens: int, all_tokens: int) -> dict[str, float]:
    """`timing_s/<stage>` for every timed stage, and for the model stages

        timing_per_token_ms/<stage> = 1000 · seconds / tokens       (0 when the batch has no such tokens)

    Generation is divided by the number of response tokens; `old_log_prob`, `ref`, `values`, `adv`,
    `update_critic` and `update_actor` by all tokens (prompt + response) of the batch.
    """
    metrics = {f"timing_s/{name}": float(seconds) for name, seconds in timing.items()}
    for name, seconds in timing.items():
        if name in _PER_RESPONSE_TOKEN_STAGES:
            tokens = response_tokens
        elif name in _PER_TOKEN_STAGES:
            tokens = all_tokens
        else:
            continue
        metrics[f"timing_per_token_ms/{name}"] = 1000.0 * seconds / tokens if tokens else 0.0
    return metrics


def compute_throughput_metrics(batch: DataProto, timing: Mapping[str, float], n_devices: int) -> dict[str, float]:
    """Tokens processed per second per device over the whole step (`throughput_metrics_for_tokens`), counting
    prompt and response tokens (padding excluded) from the batch's attention mask."""
    return throughput_metrics_for_tokens(timing, _token_counts(batch)[1], n_devices)


def throughput_metrics_for_tokens(timing: Mapping[str, float], all_tokens: int, n_devices: int) -> dict[str, float]:
    """Tokens processed per second per device over the whole step:

        perf/throughput = total_num_tokens / (timing["step"] · n_devices)

    `timing["step"]` is the wall-clock time of the whole step. Also reports `perf/total_num_tokens` and
    `perf/time_per_step`.
    """
    if "step" not in timing:
        raise ValueError(
            f"compute_throughput_metrics needs timing['step'] (the whole step's time); got stages {sorted(timing)}. "
            f"Wrap the step in `with timer('step', timing):`."
        )
    if n_devices < 1:
        raise ValueError(f"n_devices={n_devices}: throughput is per device, so it needs at least 1.")
    step_seconds = float(timing["step"])
    return {
        "perf/total_num_tokens": float(all_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": all_tokens / max(step_seconds, 1e-9) / n_devices,
    }


def staleness_metrics(
    row_versions: Sequence[int], response_mask: torch.Tensor, trainer_version: int
) -> dict[str, float]:
    """How old the trained samples are. Row i was sampled by policy version v_i and trains weights of version V:
    its staleness is s_i = V − v_i. Returns `async/staleness_{mean,max}`, the histogram `async/samples_staleness_<s>`
    (the fraction of rows with staleness s) and `async/tokens_staleness_<s>` (the fraction of response tokens,
    `response_mask` (B, R), sampled by version V − s), for every s that occurs."""
    staleness = trainer_version - torch.as_tensor(np.asarray(row_versions, dtype=np.int64))
    tokens = response_mask.sum(-1).to(torch.float64)
    stats = {"async/staleness_mean": staleness.double().mean(), "async/staleness_max": staleness.max().double()}
    for value in staleness.unique().tolist():
        rows = staleness == value
        stats[f"async/samples_staleness_{value}"] = rows.double().mean()
        stats[f"async/tokens_staleness_{value}"] = tokens[rows].sum() / tokens.sum().clamp_min(1.0)
    return _to_floats(stats)
