"""The `prime` reward manager: scores responses in a process pool with a per-response timeout.

A scorer that hangs, crashes its process or raises gives 0 for that response; the step goes on, and the counts
appear in `reward_extra_info` as per-row flags `reward_timeout`, `reward_crash`, `reward_error` (their mean is the
fraction of responses affected). Settings: `reward_model.num_processes`, `reward_model.timeout` (seconds).
The scoring function must be picklable (module-level functions and `custom_reward_function` files are).
"""

from __future__ import annotations

import logging
from typing import Any

from hyflow.reward.managers import register_reward_manager
from hyflow.reward.managers.base import RewardManager, ScoringBatch
from hyflow.reward.scoring_pool import ScoringPool

logger = logging.getLogger(__name__)

FAILURE_FLAGS = {"timeout": "reward_timeout", "crash": "reward_crash", "error": "reward_error"}


@register_reward_manager
class PrimeRewardManager(RewardManager):
    """Per-response scoring in `num_processes` worker processes, each call limited to `timeout` seconds."""

    name = "prime"

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Any = None,
        reward_fn_key: str = "data_source",
        num_processes: int = 8,
        timeout: float = 300.0,
        start_method: str = "spawn",
    ) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)
        self.pool = ScoringPool(num_processes, timeout, start_method)

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, num_examine: int, compute_score: Any) -> PrimeRewardManager:
        rm = config.reward_model
        return cls(tokenizer, num_examine, compute_score, config.data.reward_fn_key, rm.num_processes, rm.timeout)

    def score(self, batch: ScoringBatch) -> list[float | dict[str, Any]]:
        calls = [
            {"data_source": source, "solution_str": solution, "ground_truth": truth, "extra_info": extra}
            for source, solution, truth, extra in zip(
                batch.data_sources, batch.solution_strs, batch.ground_truths, batch.extra_infos
            )
        ]
        results: list[float | dict[str, Any]] = []
        for row, outcome in zip(batch.rows, self.pool.run(self.compute_score, calls)):
            flags = {flag: 0.0 for flag in FAILURE_FLAGS.values()}
            if outcome.status == "ok":
                value = outcome.value if isinstance(outcome.value, dict) else {"score": outcome.value}
                results.append({**value, **flags})
                continue
            logger.warning("row %d scored 0: %s (%s)", row, outcome.status, outcome.error)
            flags[FAILURE_FLAGS[outcome.status]] = 1.0
            results.append({"score": 0.0, **flags})
        return results
