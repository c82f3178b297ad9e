"""The `naive` reward manager: one `compute_score` call per response, in this process."""

from __future__ import annotations

from typing import Any

from hyflow.reward.managers import register_reward_manager
from hyflow.reward.managers.base import RewardManager, ScoringBatch


def describe_function(fn: Any) -> str:
    """A readable name of a scoring function for error messages."""
    return getattr(fn, "__qualname__", None) or repr(fn)


@register_reward_manager
class NaiveRewardManager(RewardManager):
    """Calls `compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)` per row.

    A scorer that raises stops the step with a ValueError naming the function, the row and its data source.
    """

    name = "naive"

    def score(self, batch: ScoringBatch) -> list[float | dict[str, Any]]:
        results = []
        for i, row in enumerate(batch.rows):
            try:
                result = self.compute_score(
                    data_source=batch.data_sources[i],
                    solution_str=batch.solution_strs[i],
                    ground_truth=batch.ground_truths[i],
                    extra_info=batch.extra_infos[i],
                )
            except Exception as exc:
                raise ValueError(
                    f"reward function {describe_function(self.compute_score)} raised {type(exc).__name__}: {exc} "
                    f"on row {row} (data_source={batch.data_sources[i]!r}, response {batch.solution_strs[i][:100]!r}). "
                    "Fix the function, or use reward_model.reward_manager=prime to score such rows 0."
                ) from exc
            results.append(result)
        return results
