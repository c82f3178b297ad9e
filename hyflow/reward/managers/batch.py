"""The `batch` reward manager: one `compute_score` call with lists for the whole batch.

The function is called as `compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...],
extra_infos=[...])` and returns one result per row, so a scorer can vectorise or call a service once per batch.
Without a custom function, each row goes to its data source's built-in scorer. Like `naive`, the call runs in a
child process: raising, crashing or hanging past `reward_model.timeout_s` (600 s by default, for the whole call) is
a `RewardFunctionError` naming the function and the batch.
"""

from __future__ import annotations

from typing import Any

from hyflow.reward.isolated import IsolatedFunction
from hyflow.reward.managers import register_reward_manager
from hyflow.reward.managers.base import RewardFunctionError, RewardManager, ScoringBatch, describe_function
from hyflow.reward.managers.naive import call_isolated
from hyflow.reward.scorers import default_compute_score


def default_batch_compute_score(
    data_sources: list[str], solution_strs: list[str], ground_truths: list[Any], extra_infos: list[Any]
) -> list[float | dict[str, Any]]:
    """The built-in scorers applied row by row, in the batch signature."""
    return [
        default_compute_score(source, solution, truth, extra)
        for source, solution, truth, extra in zip(data_sources, solution_strs, ground_truths, extra_infos)
    ]


@register_reward_manager
class BatchRewardManager(RewardManager):
    """Scores all rows with a single call of a batched `compute_score`."""

    name = "batch"
    batched = True

    def __init__(
        self, tokenizer: Any, num_examine: int = 0, compute_score: Any = None, reward_fn_key: str = "data_source",
        **failure_settings: Any,
    ) -> None:  # fmt: skip
        compute_score = compute_score or default_batch_compute_score
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **failure_settings)
        self.isolated = IsolatedFunction(self.compute_score, self.timeout_s)

    def score(self, batch: ScoringBatch) -> list[float | dict[str, Any]]:
        sources = sorted(set(batch.data_sources))
        name = describe_function(self.compute_score)
        where = f"batched reward function {name}, on {len(batch.rows)} rows of data sources {sources}"
        results = call_isolated(
            self.isolated,
            where,
            data_sources=batch.data_sources,
            solution_strs=batch.solution_strs,
            ground_truths=batch.ground_truths,
            extra_infos=batch.extra_infos,
        )
        if not _is_row_list(results) or len(results) != len(batch.rows):
            raise RewardFunctionError(
                f"batched reward function {describe_function(self.compute_score)} returned {_describe_count(results)} "
                f"for {len(batch.rows)} responses; return one score (or dict) per response."
            )
        return list(results)


def _is_row_list(results: Any) -> bool:
    """A list, tuple or 1-D array of per-row results."""
    return isinstance(results, list | tuple) or getattr(results, "ndim", None) == 1


def _describe_count(results: Any) -> str:
    return f"{len(results)} results" if _is_row_list(results) else f"{results!r:.80}"
