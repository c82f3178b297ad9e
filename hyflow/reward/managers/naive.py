"""The `naive` reward manager: one `compute_score` call per response, in a child process of this one.

The calls run in a forked child (`hyflow.reward.isolated`), one after the other: a function that raises, calls
`os._exit`, crashes its process or takes longer than `reward_model.timeout_s` (600 s by default) stops the step with
a `RewardFunctionError` naming the function, the row and its data source, instead of ending the run silently.
"""

from __future__ import annotations

from typing import Any

from hyflow.reward.isolated import FunctionCrashed, FunctionRaised, FunctionTimedOut, IsolatedFunction
from hyflow.reward.managers import register_reward_manager
from hyflow.reward.managers.base import RewardFunctionError, RewardManager, ScoringBatch, describe_function

__all__ = ["NaiveRewardManager", "call_isolated", "describe_function"]

_FIX = "Fix the function, or use reward_model.reward_manager=prime to score such rows 0 and go on."


def call_isolated(call: IsolatedFunction, where: str, timeout_key: str = "reward_model.timeout_s", **kwargs: Any):
    """`call(**kwargs)`; its failure becomes a RewardFunctionError that starts with `where` (function and row)."""
    try:
        return call(**kwargs)
    except FunctionRaised as exc:
        raise RewardFunctionError(f"{where} raised {exc}. {_FIX}\n{exc.details}") from None
    except FunctionCrashed as exc:
        raise RewardFunctionError(
            f"{where} ended the process that ran it (exit code {exc.exit_code}: it called os._exit or exit(), "
            f"crashed, or was killed for memory). {_FIX}"
        ) from None
    except FunctionTimedOut:
        raise RewardFunctionError(
            f"{where} gave no result within {timeout_key}={call.timeout_s}s. Fix the function, raise {timeout_key} "
            "for a slow scorer (null: no limit), or use reward_model.reward_manager=prime to score such rows 0."
        ) from None


@register_reward_manager
class NaiveRewardManager(RewardManager):
    """Calls `compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)` per row."""

    name = "naive"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.isolated = IsolatedFunction(self.compute_score, self.timeout_s)

    def score(self, batch: ScoringBatch) -> list[float | dict[str, Any]]:
        return [
            call_isolated(
                self.isolated,
                self._where(batch, i),
                data_source=batch.data_sources[i],
                solution_str=batch.solution_strs[i],
                ground_truth=batch.ground_truths[i],
                extra_info=batch.extra_infos[i],
            )
            for i in range(len(batch.rows))
        ]
