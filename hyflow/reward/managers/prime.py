"""The `prime` reward manager: scores responses in a process pool with a per-response timeout.

A scorer that hangs, crashes its process or raises gives 0 for that response; the step goes on, and the counts
appear in `reward_extra_info` as per-row flags `reward_timeout`, `reward_crash`, `reward_error` (training metrics
`reward/timeout_count`, `reward/crash_count`, `reward/error_count`). When at least
`reward_model.stop_at_failed_fraction` of a batch's rows fail (default: all of them), the run stops with an error.
Settings: `reward_model.num_processes`, `reward_model.timeout` (seconds).
The scoring function must be picklable (module-level functions and `custom_reward_function` files are).
"""

from __future__ import annotations

import logging
from typing import Any

from hyflow.reward.managers import register_reward_manager
from hyflow.reward.managers.base import FAILURE_FLAGS, RewardManager, ScoringBatch
from hyflow.reward.scoring_pool import ScoringPool

logger = logging.getLogger(__name__)

POOL_FAILURES = ("error", "crash", "timeout")  # the ScoringPool outcomes other than "ok"


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
        **failure_settings: Any,
    ) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **failure_settings)
        self.pool = ScoringPool(num_processes, timeout, start_method)

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, num_examine: int, compute_score: Any) -> PrimeRewardManager:
        rm = config.reward_model
        return cls(
            tokenizer, num_examine, compute_score, config.data.reward_fn_key, rm.num_processes, rm.timeout,
            **cls.failure_settings(config),
        )  # fmt: skip

    def score(self, batch: ScoringBatch) -> list[float | dict[str, Any]]:
        calls = [
            {"data_source": source, "solution_str": solution, "ground_truth": truth, "extra_info": extra}
            for source, solution, truth, extra in zip(
                batch.data_sources, batch.solution_strs, batch.ground_truths, batch.extra_infos
            )
        ]
        results: list[float | dict[str, Any]] = []
        for i, outcome in enumerate(self.pool.run(self.compute_score, calls)):
            flags = {FAILURE_FLAGS[kind]: 0.0 for kind in POOL_FAILURES}
            if outcome.status == "ok":
                value = outcome.value if isinstance(outcome.value, dict) else {"score": outcome.value}
                results.append({**value, **flags})
                continue
            logger.warning("%s scored 0: %s (%s)", self._where(batch, i), outcome.status, outcome.error)
            flags[FAILURE_FLAGS[outcome.status]] = 1.0
            results.append({"score": 0.0, **flags})
        return results
