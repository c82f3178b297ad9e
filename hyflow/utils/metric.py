"""Metrics that know how they combine: a value per micro-batch (and per rank), reduced by mean, sum, min or max.

verl's `verl.utils.metric` under the same names. Most metrics are means, but a loss normalised by the global
token count is a *partial sum*: its micro-batch values add up to the mini-batch loss, so it must be reduced with
SUM, and across data-parallel ranks (each holding the same number of micro-batches) with the mean of the ranks:

    metrics = {}
    for micro in micro_batches:
        append_to_dict(metrics, {"critic/vf_loss": Metric("sum", vf_loss)})   # a scalar tensor or a number
    reduce_metrics(metrics)["critic/vf_loss"]                               # the mini-batch's loss

A plain list is reduced by its key's name: `max` in the key -> max, `min` -> min, otherwise the mean. (hyflow's
own trainer logs means of plain lists through `hyflow.trainer.metrics.reduce_metrics`; this module is verl's
contract, for worker code that reports `Metric` objects.)
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

import numpy as np
import torch

__all__ = ["AggregationType", "Metric", "append_to_dict", "reduce_metrics"]

Numeric = int | float | torch.Tensor | np.ndarray


class AggregationType(Enum):
    """How the values of one metric combine."""

    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


_REDUCE = {AggregationType.MEAN: np.mean, AggregationType.SUM: np.sum, AggregationType.MIN: np.min,
           AggregationType.MAX: np.max}  # fmt: skip


class Metric:
    """The values of one metric (plain floats) and the rule that combines them."""

    def __init__(self, aggregation: str | AggregationType, value: Numeric | list[Numeric] | None = None) -> None:
        try:
            self.aggregation = AggregationType(aggregation)
        except ValueError:
            allowed = [kind.value for kind in AggregationType]
            raise ValueError(f"aggregation={aggregation!r} is not one of {allowed}.") from None
        self.values: list[float] = []
        if isinstance(value, list):
            self.extend(value)
        elif value is not None:
            self.append(value)

    def append(self, value: Numeric | Metric) -> None:
        """Add one value (a number or a one-element tensor/array), or all values of another Metric."""
        if isinstance(value, Metric):
            self.extend(value)
            return
        if isinstance(value, torch.Tensor | np.ndarray):
            size = value.numel() if isinstance(value, torch.Tensor) else value.size
            if size != 1:
                raise ValueError(f"a metric value must be a scalar; got shape {tuple(value.shape)}.")
            value = value.item()  # host sync: metrics are read once per step
        if not isinstance(value, numbers.Number):
            raise ValueError(f"a metric value must be a number; got {type(value).__name__} {value!r}.")
        self.values.append(value)

    def extend(self, values: Metric | Iterable[Numeric]) -> None:
        """Add several values; another Metric must combine the same way."""
        if isinstance(values, Metric):
            if values.aggregation != self.aggregation:
                raise ValueError(
                    f"cannot merge a {values.aggregation.value} metric into a {self.aggregation.value} one."
                )
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> float:
        """The values combined by the metric's rule."""
        return _REDUCE[self.aggregation](self.values)

    @classmethod
    def aggregate_dp(cls, metric_lists: list[Metric]) -> float:
        """One value from every rank's Metric (ranks hold the same number of micro-batches).

        SUM / MEAN: each micro-batch position is averaged over the ranks first (gradient averaging), then reduced;
        MIN / MAX: over all values of all ranks.
        """
        if not metric_lists:
            raise ValueError("aggregate_dp needs at least one rank's Metric.")
        counts = [len(metric.values) for metric in metric_lists]
        if len(set(counts)) > 1:
            raise ValueError(f"every rank must report the same number of values; got {counts}.")
        values = np.array([metric.values for metric in metric_lists])  # (ranks, micro-batches)
        aggregation = metric_lists[0].aggregation
        if aggregation in (AggregationType.SUM, AggregationType.MEAN):
            return _REDUCE[aggregation](values.mean(axis=0))
        return _REDUCE[aggregation](values)

    @classmethod
    def from_dict(cls, data: Mapping[str, Numeric], aggregation: str | AggregationType) -> dict[str, Metric]:
        """One Metric per key, all combined the same way."""
        return {key: cls(aggregation, value) for key, value in data.items()}

    def init_list(self) -> Metric:
        """An empty Metric with the same rule."""
        return Metric(self.aggregation)

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value!r}, {self.values!r})"


def append_to_dict(data: dict[str, Any], new_data: Mapping[str, Any]) -> None:
    """Add each value of `new_data` to `data[key]` (a list, or a Metric when the value is one), in place."""
    for key, value in new_data.items():
        if key not in data:
            data[key] = value.init_list() if isinstance(value, Metric) else []
        data[key].append(value)


def reduce_metrics(metrics: dict[str, Metric | list[Any]]) -> dict[str, Any]:
    """Each Metric by its rule, each list by its key (max / min / mean); the dict is updated in place."""
    for key, value in metrics.items():
        if isinstance(value, Metric):
            metrics[key] = value.aggregate()
        elif "max" in key:
            metrics[key] = np.max(value)
        elif "min" in key:
            metrics[key] = np.min(value)
        else:
            metrics[key] = np.mean(value)
    return metrics
