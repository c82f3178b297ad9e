"""The `batch` reward manager: one `compute_score` call with lists for the whole batch.

The function is called as `compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...],
extra_infos=[...])` and returns one result per row, so a scorer can vectorise or call a service once per batch.
Without a custom function, each row goes to its data source's built-in scorer.
"""

from __future__ import annotations

from typing import Any

from hyflow.reward.managers import register_reward_manager
from hyflow.reward.managers.base import RewardManager, ScoringBatch
from hyflow.reward.managers.naive import describe_function
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
        self, tokenizer: Any, num_examine: int = 0, compute_score: Any = None, reward_fn_key: str = "data_source"
    ) -> None:
        super().__init__(tokenizer, num_examine, compute_score or default_batch_compute_score, reward_fn_key)

    def score(self, batch: ScoringBatch) -> list[float | dict[str, Any]]:
        results = self.compute_score(
            data_sources=batch.data_sources,
            solution_strs=batch.solution_strs,
            ground_truths=batch.ground_truths,
            extra_infos=batch.extra_infos,
        )
        if len(results) != len(batch.rows):
            raise ValueError(
                f"batched reward function {describe_function(self.compute_score)} returned {len(results)} results "
                f"for {len(batch.rows)} responses; return one score (or dict) per response."
            )
        return list(results)
