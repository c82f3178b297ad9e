"""Rule-based scorers, one file per task, registered by data source.

A scorer is a plain function `compute_score(data_source, solution_str, ground_truth, extra_info=None)` that
returns a float, or a dict with a float `score` plus extra fields (these become metrics). A new dataset adds a
file here that decorates its scorer with `@register_scorer("its/data_source", ...)`; every module in this
package is imported the first time a scorer is looked up, so nothing central needs editing.
A family of data sources that share a prefix (`reasoning_gym/<task>`) registers once with
`@register_scorer_prefix("reasoning_gym/")`; an exact registration wins over a prefix.

    from hyflow.reward.scorers import default_compute_score, gsm8k, math
    default_compute_score("openai/gsm8k", "... #### 72", "72")      # -> 1.0
    gsm8k.compute_score("... #### 72", "72", method="strict")         # the task's own signature
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

ScoreFn = Callable[..., "float | dict[str, Any]"]

_SCORERS: dict[str, ScoreFn] = {}
_PREFIX_SCORERS: dict[str, ScoreFn] = {}  # data source prefix -> scorer of every data source that starts with it
_WITHOUT_GROUND_TRUTH: set[str] = set()  # data sources whose scorer reads no ground_truth
_ALL_IMPORTED = False


def register_scorer(*data_sources: str, needs_ground_truth: bool = True) -> Callable[[ScoreFn], ScoreFn]:
    """Decorator: register `fn(data_source, solution_str, ground_truth, extra_info=None)` for these data sources.
    `needs_ground_truth=False` lets their rows hold `ground_truth: None` (otherwise rejected when the data loads)."""
    if not data_sources:
        raise ValueError("register_scorer needs at least one data source name, e.g. @register_scorer('my/task').")

    def decorator(fn: ScoreFn) -> ScoreFn:
        for name in data_sources:
            existing = _SCORERS.get(name)
            if existing is not None and existing is not fn:
                raise ValueError(
                    f"register_scorer: data source {name!r} already has scorer {existing.__module__}."
                    f"{existing.__qualname__}; pick another data source name or drop one registration."
                )
            _SCORERS[name] = fn
            if not needs_ground_truth:
                _WITHOUT_GROUND_TRUTH.add(name)
        return fn

    return decorator


def register_scorer_prefix(prefix: str) -> Callable[[ScoreFn], ScoreFn]:
    """Decorator: register `fn` for every data source that starts with `prefix` (e.g. `"reasoning_gym/"`)."""
    if not prefix:
        raise ValueError("register_scorer_prefix needs a non-empty prefix, e.g. 'reasoning_gym/'.")

    def decorator(fn: ScoreFn) -> ScoreFn:
        existing = _PREFIX_SCORERS.get(prefix)
        if existing is not None and existing is not fn:
            raise ValueError(f"register_scorer_prefix: prefix {prefix!r} already has scorer {existing.__qualname__}.")
        _PREFIX_SCORERS[prefix] = fn
        return fn

    return decorator


def _import_all_scorers() -> None:
    """Import every module of this package once so each file's `@register_scorer` has run."""
    global _ALL_IMPORTED
    if _ALL_IMPORTED:
        return
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    _ALL_IMPORTED = True


def registered_data_sources() -> list[str]:
    """All data source names that have a built-in scorer."""
    _import_all_scorers()
    return sorted(_SCORERS)


def needs_ground_truth(data_source: str) -> bool:
    """False only for data sources whose registered scorer declared `needs_ground_truth=False`."""
    _import_all_scorers()
    return data_source not in _WITHOUT_GROUND_TRUTH


def get_scorer(data_source: str) -> ScoreFn:
    """The registered scorer for `data_source`; a ValueError lists the known data sources otherwise."""
    _import_all_scorers()
    if data_source not in _SCORERS:
        for prefix, fn in _PREFIX_SCORERS.items():
            if data_source.startswith(prefix):
                return fn
        raise ValueError(
            f"No built-in scorer for data_source={data_source!r}. Known data sources: {sorted(_SCORERS)}, and "
            f"those starting with {sorted(_PREFIX_SCORERS)}. "
            "Register one with @hyflow.reward.scorers.register_scorer, or set custom_reward_function.path/name "
            "to a file with your compute_score."
        )
    return _SCORERS[data_source]


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> float | dict[str, Any]:
    """Score one response with the scorer registered for its data source (verl's `default_compute_score`)."""
    return get_scorer(data_source)(data_source, solution_str, ground_truth, extra_info, **kwargs)
