"""verl's `verl.trainer.ppo.metric_utils` names, for code ported from verl: hyflow's metric functions plus verl's
two small bootstrap helpers.

    compute_data_metrics(batch, use_critic=True)        # hyflow.trainer.metrics, verl's key names
    compute_throughout_metrics(batch, timing, n_gpus)   # verl's spelling of compute_throughput_metrics
    bootstrap_metric([1, 2, 3], 2, [np.mean, np.max])   # [(mean, std) of each statistic over resamples]
    calc_maj_val(samples, vote_key="pred", val_key="acc")

hyflow's own validation metrics (`hyflow.trainer.validation.process_validation_metrics`) are a flat dict of
`val-core/...` / `val-aux/...` keys, vectorised; verl's is nested per data source.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hyflow.protocol import DataProto
from hyflow.trainer.metrics import compute_data_metrics, compute_throughput_metrics, compute_timing_metrics
from hyflow.trainer.validation import process_validation_metrics

__all__ = [
    "bootstrap_metric",
    "calc_maj_val",
    "compute_data_metrics",
    "compute_throughout_metrics",
    "compute_timing_metrics",
    "process_validation_metrics",
]


def compute_throughout_metrics(batch: DataProto, timing_raw: dict[str, float], n_gpus: int) -> dict[str, float]:
    """verl's name and keywords for `hyflow.trainer.metrics.compute_throughput_metrics`."""
    return compute_throughput_metrics(batch, timing_raw, n_devices=n_gpus)


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
