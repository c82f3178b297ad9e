"""Training metrics of a batch's reward extras: failure counts and the mean of each extra a scorer reported.

    metrics = reward_metrics({"acc": [1.0, 0.0], "reward_error": [0.0, 1.0], "reward_non_finite": [0.0, 0.0]})
    # {"reward/error_count": 1.0, "reward/crash_count": 0.0, "reward/timeout_count": 0.0,
    #  "reward/non_finite_count": 0.0, "reward/extra/acc/mean": 0.5}

`reward/<kind>_count` = Σ_rows flag (the per-row 0/1 flags of `FAILURE_FLAGS`; 0 when no manager flagged that
kind); `reward/extra/<name>/mean` = mean over the rows that report a finite number under `name` (rows without it
hold nan; non-numeric extras such as predicted strings are left out, and the reward manager names them in a
warning); `reward/extra/<name>/non_finite_count` = the rows whose `name` is ±inf, present only when some are.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from hyflow.reward.managers.base import FAILURE_FLAGS


def _finite_numbers(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, numbers.Real) and math.isfinite(float(v))]


def reward_metrics(extra_info: Mapping[str, Sequence[Any]]) -> dict[str, float]:
    """The metrics above from per-row extras (`reward_extra_info`, or the batch's columns of the same names)."""
    metrics = {f"reward/{kind}_count": sum(_finite_numbers(extra_info.get(flag, []))) for kind, flag in
               FAILURE_FLAGS.items()}  # fmt: skip
    flags = set(FAILURE_FLAGS.values())
    for name, values in sorted(extra_info.items()):
        numbers_ = _finite_numbers(values)
        if name in flags:
            continue
        if numbers_:
            metrics[f"reward/extra/{name}/mean"] = sum(numbers_) / len(numbers_)
        infinite = sum(1 for v in values if isinstance(v, numbers.Real) and math.isinf(float(v)))
        if infinite:
            metrics[f"reward/extra/{name}/non_finite_count"] = float(infinite)
    return metrics
