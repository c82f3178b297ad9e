"""verl's `verl.trainer.ppo.metric_utils` names, for code ported from verl: hyflow's metric functions under
verl's names and return shapes, plus verl's two small bootstrap helpers.

    compute_data_metrics(batch, use_critic=True)        # hyflow.trainer.metrics, verl's key names
    compute_timing_metrics(batch, timing_raw)           # per-token times from _compute_response_info(batch)
    compute_throughout_metrics(batch, timing, n_gpus)   # tokens of meta_info["global_token_num"], as verl
    process_validation_metrics(sources, uids, infos)    # {data_source: {var: {metric: value}}}
    bootstrap_metric([1, 2, 3], 2, [np.mean, np.max])   # [(mean, std) of each statistic over resamples]
    calc_maj_val(samples, vote_key="pred", val_key="acc")

hyflow's own validation metrics (`hyflow.trainer.validation.process_validation_metrics`) are the same values as
one flat dict of `val-core/...` / `val-aux/...` keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from hyflow import fields as F
from hyflow.protocol import DataProto
from hyflow.trainer.metrics import (
    _lengths,
    compute_data_metrics,
    compute_throughput_metrics,
    throughput_metrics_for_tokens,
    timing_metrics_for_tokens,
)
from hyflow.trainer.validation import validation_metrics_by_source

__all__ = [
    "bootstrap_metric",
    "calc_maj_val",
    "compute_data_metrics",
    "compute_throughout_metrics",
    "compute_timing_metrics",
    "process_validation_metrics",
]


def _compute_response_info(batch: DataProto) -> dict[str, torch.Tensor]:
    """verl's per-row `prompt_length` and `response_length` (B,) and the response part of the attention mask
    (B, R), from the batch's attention mask."""
    prompt_length, response_length, prompt_width, _ = _lengths(batch)
    response_mask = batch.batch[F.ATTENTION_MASK][:, prompt_width:]
    return {"prompt_length": prompt_length, "response_length": response_length, "response_mask": response_mask}


def compute_timing_metrics(batch: DataProto, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """`timing_s/<stage>` and `timing_per_token_ms/<stage>` (`hyflow.trainer.metrics.timing_metrics_for_tokens`)
    with the token counts of `_compute_response_info`."""
    info = _compute_response_info(batch)
    prompt_tokens, response_tokens = torch.stack([info["prompt_length"].sum(), info["response_length"].sum()]).tolist()
    return timing_metrics_for_tokens(timing_raw, int(response_tokens), int(prompt_tokens + response_tokens))


def compute_throughout_metrics(batch: DataProto, timing_raw: Mapping[str, float], n_gpus: int) -> dict[str, float]:
    """verl's spelling of `hyflow.trainer.metrics.compute_throughput_metrics`. As verl, it counts the tokens the
    trainer recorded per row in `meta_info["global_token_num"]`; without them, those of the attention mask."""
    if F.GLOBAL_TOKEN_NUM not in batch.meta_info:
        return compute_throughput_metrics(batch, timing_raw, n_devices=n_gpus)
    return throughput_metrics_for_tokens(timing_raw, int(sum(batch.meta_info[F.GLOBAL_TOKEN_NUM])), n_gpus)


def process_validation_metrics(
    data_sources: Sequence[str], sample_uids: Sequence[Any], infos_dict: dict[str, Sequence[Any]], seed: int = 42
) -> dict[str, dict[str, dict[str, float]]]:
    """verl's nested validation metrics, `{data_source: {var: {metric: value}}}`
    (`hyflow.trainer.validation.validation_metrics_by_source`)."""
    return validation_metrics_by_source(data_sources, sample_uids, infos_dict, seed=seed)


def bootstrap_metric(
    data: Sequence[Any],
    subset_size: int,
    reduce_fns: Sequence[Callable[[np.ndarray], float]],
    n_bootstrap: int = 1000,
    seed: int = 42,
) -> list[tuple[float, float]]:
    """For each statistic f in `reduce_fns`: the mean and std of f over `n_bootstrap` resamples of `subset_size`
    items drawn with replacement from `data` (seeded: the same result on every run).

    Raises:
        ValueError: `data` is empty.
    """
    if len(data) == 0:
        raise ValueError("bootstrap_metric needs at least one value to resample; got an empty list.")
    rng = np.random.default_rng(seed)
    values = np.array(data, dtype=object)
    draws = values[rng.integers(0, len(values), size=(n_bootstrap, subset_size))]  # (n_bootstrap, subset_size)
    results = []
    for reduce_fn in reduce_fns:
        statistic = np.array([reduce_fn(sample) for sample in draws], dtype=np.float64)
        results.append((float(statistic.mean()), float(statistic.std())))
    return results


def calc_maj_val(data: Sequence[dict[str, Any]], vote_key: str, val_key: str) -> Any:
    """`val_key` of the first sample whose `vote_key` is the most common one (ties: the vote seen first)."""
    votes = Counter(sample[vote_key] for sample in data)
    winner = max(votes, key=votes.__getitem__)
    return next(sample[val_key] for sample in data if sample[vote_key] == winner)
