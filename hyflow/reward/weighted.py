"""A weighted sum of several scoring functions, itself a scoring function (`reward_model.reward_functions`).

    reward_model.reward_functions='[{name: format, weight: 0.2}, {name: correctness, weight: 0.7},
                                    {name: length, weight: 0.1, reward_kwargs: {max_chars: 200}}]'

score = Σ_k weight_k · score_k. Each entry is a built-in component (when `path` is None) or function `name` of the
file at `path`. Built-ins: `format` (one well-formed `<answer>...</answer>` block), `correctness` (the data
source's scorer; its `acc` part when it reports one), `compute_score` (the data source's full score) and `length`
(1 for an empty response, falling linearly to 0 at `max_chars` characters). The result is a dict holding the
combined `score` and each component's value, so every part shows up as its own metric.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hyflow.reward.custom import SAMPLE_ARGS, check_signature, load_custom_function
from hyflow.reward.scorers import default_compute_score
from hyflow.reward.scorers.answer_tags import format_reward


def score_value(result: float | dict[str, Any]) -> float:
    """The float score of a scorer's result (a float, or a dict with `score`)."""
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"a scorer returned a dict without 'score' (keys {sorted(result)}); add 'score'.")
        return float(result["score"])
    return float(result)


def format_component(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 for exactly one non-empty `<answer>...</answer>` block, else 0.0."""
    return format_reward(solution_str)


def correctness_component(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The data source's scorer without its format bonus: `acc` when it reports one, else its score."""
    result = default_compute_score(data_source, solution_str, ground_truth, extra_info)
    if isinstance(result, dict) and "acc" in result:
        return float(result["acc"])
    return score_value(result)


def length_component(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, max_chars: int = 200
) -> float:
    """Brevity: 1 - min(len(solution_str), max_chars) / max_chars."""
    if max_chars <= 0:
        raise ValueError(f"length reward: max_chars={max_chars} must be positive, e.g. 200.")
    return 1.0 - min(len(solution_str), max_chars) / max_chars


def _full_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return score_value(default_compute_score(data_source, solution_str, ground_truth, extra_info))


BUILTIN_COMPONENTS: dict[str, Callable[..., float]] = {
    "format": format_component,
    "correctness": correctness_component,
    "compute_score": _full_score,
    "length": length_component,
}


class WeightedScore:
    """`score = Σ weight_k · fn_k(...)` over named functions; returns {"score", <name>: value, ...}."""

    def __init__(self, components: Sequence[tuple[str, Callable[..., Any], float, dict[str, Any]]]) -> None:
        if not components:
            raise ValueError("reward_model.reward_functions is empty; list at least one {name, weight}.")
        self.components = list(components)

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
    ) -> dict[str, float]:
        parts = {
            name: score_value(
                fn(
                    data_source=data_source,
                    solution_str=solution_str,
                    ground_truth=ground_truth,
                    extra_info=extra_info,
                    **kwargs,
                )
            )
            for name, fn, _, kwargs in self.components
        }
        total = sum(weight * parts[name] for name, _, weight, _ in self.components)
        return {"score": total, **parts}


def build_weighted_score(functions: Sequence[Any]) -> WeightedScore:
    """A `WeightedScore` from `RewardFunctionConfig` entries (name, path, weight, reward_kwargs), each checked."""
    components = []
    for entry in functions:
        if entry.path is None:
            if entry.name not in BUILTIN_COMPONENTS:
                raise ValueError(
                    f"reward_model.reward_functions: name={entry.name!r} without a path must be a built-in "
                    f"component, one of {sorted(BUILTIN_COMPONENTS)}; or set path to the file that defines it."
                )
            fn, kwargs = BUILTIN_COMPONENTS[entry.name], dict(entry.reward_kwargs)
            check_signature(fn, entry.name, SAMPLE_ARGS, kwargs)
        else:
            fn, kwargs = load_custom_function(entry.path, entry.name, entry.reward_kwargs), {}
        label = entry.name if entry.name not in {c[0] for c in components} else f"{entry.name}_{len(components)}"
        components.append((label, fn, float(entry.weight), kwargs))
    return WeightedScore(components)
