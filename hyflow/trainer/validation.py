"""Validation metrics per data source: mean@N, best@k, worst@k and maj@k, with a seeded bootstrap (as verl).

Each validation prompt (one `uid`) is answered N times (`actor_rollout_ref.rollout.val_kwargs.n`). For every
variable recorded per sample (`reward` — the score — and any extra the reward function returns, such as `acc`),
and for each prompt:

- `mean@N`, `std@N`: over the N samples;
- `best@k/mean`, `worst@k/mean` (and `/std`) for k = 2, 4, 8, ... < N and k = N: draw k of the N samples with
  replacement, take the max (min); repeat `n_bootstrap` times; report the mean (std) over draws;
- `maj@k/mean` (and `/std`) when predictions (`pred`) are given: in each draw, the majority answer wins (ties go
  to the answer that appears first in the draw) and the value is that of the first sample giving it.

Then each metric is averaged over the prompts of a data source and named
`val-core/<data_source>/<var>/<metric>` for the headline numbers (mean@N, best@N, maj@N of `acc` when recorded,
else of `reward`) and `val-aux/<data_source>/<var>/<metric>` for the rest.

    metrics = process_validation_metrics(data_sources, uids, {"reward": scores, "pred": answers}, seed=42)
    metrics["val-core/gsm8k/reward/mean@4"]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "bootstrap_best_worst",
    "bootstrap_majority",
    "process_validation_metrics",
    "select_generations_to_log",
    "validation_metrics_by_source",
]


def _subset_sizes(num_samples: int) -> list[int]:
    """k = 2, 4, 8, ... below N, then N itself."""
    sizes, k = [], 2
    while k < num_samples:
        sizes.append(k)
        k *= 2
    return [*sizes, num_samples]


def bootstrap_best_worst(
    values: np.ndarray, subset_size: int, n_bootstrap: int, rng: np.random.Generator
) -> dict[str, float]:
    """Bootstrap of the best (max) and worst (min) of `subset_size` draws with replacement from `values`."""
    draws = values[rng.integers(0, len(values), size=(n_bootstrap, subset_size))]
    best, worst = draws.max(axis=1), draws.min(axis=1)
    return {
        f"best@{subset_size}/mean": float(best.mean()),
        f"best@{subset_size}/std": float(best.std()),
        f"worst@{subset_size}/mean": float(worst.mean()),
        f"worst@{subset_size}/std": float(worst.std()),
    }


def bootstrap_majority(
    values: np.ndarray, predictions: Sequence[Any], subset_size: int, n_bootstrap: int, rng: np.random.Generator
) -> dict[str, float]:
    """Bootstrap of majority voting: the value of the most common prediction among `subset_size` draws.

    Ties go to the prediction that appears first in the draw; the value is that of its first sample there.
    """
    codes_of: dict[Any, int] = {}
    codes = np.array([codes_of.setdefault(_hashable(p), len(codes_of)) for p in predictions])
    draw_index = rng.integers(0, len(values), size=(n_bootstrap, subset_size))
    drawn_codes = codes[draw_index]  # (n_bootstrap, k)
    same = drawn_codes[:, :, None] == drawn_codes[:, None, :]  # (n_bootstrap, k, k)
    votes = same.sum(axis=2)  # votes[b, j]: how many draws in b share draw j's prediction
    winner_position = votes.argmax(axis=1)  # first position holding a most-voted prediction
    voted = values[draw_index[np.arange(n_bootstrap), winner_position]]
    return {f"maj@{subset_size}/mean": float(voted.mean()), f"maj@{subset_size}/std": float(voted.std())}


def _all_numbers(values: Sequence[Any]) -> bool:
    """Whether every value is a number (bool, int, float or a numpy number); other infos are not averaged."""
    return all(isinstance(v, (bool, int, float, np.number)) for v in values)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _prompt_metrics(
    var_values: dict[str, list[float]], predictions: list[Any] | None, seed: int, n_bootstrap: int
) -> dict[str, dict[str, float]]:
    """Metrics of one prompt: var name → metric name → value."""
    out: dict[str, dict[str, float]] = {}
    for var_name, raw in var_values.items():
        values = np.asarray(raw, dtype=np.float64)
        n = len(values)
        metrics = {f"mean@{n}": float(values.mean())}
        if n > 1:
            metrics[f"std@{n}"] = float(values.std())
            for k in _subset_sizes(n):
                metrics.update(bootstrap_best_worst(values, k, n_bootstrap, np.random.default_rng(seed)))
                if predictions is not None:
                    rng = np.random.default_rng(seed)
                    metrics.update(bootstrap_majority(values, predictions, k, n_bootstrap, rng))
        out[var_name] = metrics
    return out


def _section(var_name: str, core_var: str, metric_name: str, n_max: int) -> str:
    headline = metric_name.startswith(("mean@", "best@", "maj@")) and metric_name.split("/")[0].endswith(f"@{n_max}")
    return "val-core" if var_name == core_var and headline else "val-aux"


def process_validation_metrics(
    data_sources: Sequence[str],
    uids: Sequence[Any],
    infos: dict[str, Sequence[Any]],
    seed: int = 42,
    n_bootstrap: int = 1000,
) -> dict[str, float]:
    """Validation metrics per data source, named `val-core/...` and `val-aux/...` (module docstring).

    `infos` maps a variable name to one value per sample (same order as `data_sources` and `uids`): `reward`
    (the score) and extras such as `acc` are numbers; `pred` (the extracted answer) is used for majority voting
    and not reported itself; other non-numeric infos are skipped. The bootstrap is seeded, so the result is the
    same on every run.
    """
    result: dict[str, float] = {}
    for source, var_metrics in validation_metrics_by_source(data_sources, uids, infos, seed, n_bootstrap).items():
        core_var = "acc" if "acc" in var_metrics else "reward"
        for var_name, metric_values in var_metrics.items():
            n_max = max(int(name.split("@")[1].split("/")[0]) for name in metric_values)
            for metric_name, value in metric_values.items():
                section = _section(var_name, core_var, metric_name, n_max)
                result[f"{section}/{source}/{var_name}/{metric_name}"] = value
    return result


def validation_metrics_by_source(
    data_sources: Sequence[str],
    uids: Sequence[Any],
    infos: dict[str, Sequence[Any]],
    seed: int = 42,
    n_bootstrap: int = 1000,
) -> dict[str, dict[str, dict[str, float]]]:
    """`{data_source: {var: {metric: mean over the source's prompts}}}` (metrics as in the module docstring):
    the values `process_validation_metrics` names, nested as verl returns them."""
    num_samples = len(uids)
    for name, values in infos.items():
        if len(values) != num_samples:
            raise ValueError(
                f"validation info '{name}' has {len(values)} values for {num_samples} samples; every info needs one "
                f"value per sample (reward extra info must be returned for every sample)."
            )
    if len(data_sources) != num_samples:
        raise ValueError(f"{len(data_sources)} data sources for {num_samples} samples; give one per sample.")
    groups: dict[tuple[str, Any], list[int]] = defaultdict(list)
    for i, (source, uid) in enumerate(zip(data_sources, uids)):
        groups[(str(source), uid)].append(i)
    numeric = [name for name, values in infos.items() if name != "pred" and _all_numbers(values)]
    per_source: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for (source, _), rows in groups.items():
        # A variable a prompt's scorer did not report (NaN for every sample, e.g. `acc` of a GSM8K row in a batch
        # mixed with arith rows) is left out for that prompt, so it neither poisons the mean nor becomes headline.
        var_values = {name: [float(infos[name][i]) for i in rows] for name in numeric}
        var_values = {name: values for name, values in var_values.items() if not np.isnan(values).all()}
        predictions = [infos["pred"][i] for i in rows] if "pred" in infos else None
        for var_name, metrics in _prompt_metrics(var_values, predictions, seed, n_bootstrap).items():
            for metric_name, value in metrics.items():
                per_source[source][var_name][metric_name].append(value)
    return {
        source: {
            var: {name: float(np.mean(values)) for name, values in metrics.items()} for var, metrics in vars_.items()
        }
        for source, vars_ in per_source.items()
    }


def select_generations_to_log(
    inputs: Sequence[str], outputs: Sequence[str], scores: Sequence[float], num: int, seed: int = 42
) -> list[tuple[str, str, float]]:
    """A fixed, seeded sample of `num` (input, output, score) triples, so the same prompts are logged each time.

    Rows are sorted by input first, so the choice does not depend on the order the engine returned them in.
    """
    rows = sorted(zip(inputs, outputs, scores), key=lambda row: row[0])
    order = np.random.default_rng(seed).permutation(len(rows))
    return [rows[i] for i in order[:num]]
