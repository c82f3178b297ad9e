"""The `dapo` reward manager: per-response scores plus DAPO's soft overlong penalty.

DAPO (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"), overlong reward
shaping: with L_max = `data.max_response_length`, buffer length L_b = `reward_model.overlong_buffer.len` and
expected length L_e = L_max − L_b, a response of |y| tokens gets

    penalty(y) = min(0, (L_e − |y|) / L_b) · penalty_factor

added to its score: 0 up to L_e, falling linearly to −penalty_factor at L_max.
"""

from __future__ import annotations

from typing import Any

from hyflow.reward.managers import register_reward_manager
from hyflow.reward.managers.base import ScoringBatch
from hyflow.reward.managers.naive import NaiveRewardManager


def overlong_penalty(length: int, max_response_length: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong penalty for a response of `length` tokens (see the module docstring)."""
    expected = max_response_length - buffer_len
    return min(0.0, (expected - length) / buffer_len) * penalty_factor


@register_reward_manager
class DAPORewardManager(NaiveRewardManager):
    """The naive manager's scores plus the overlong penalty when `overlong_buffer.enable`."""

    name = "dapo"

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Any = None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer_cfg: Any = None,
        **failure_settings: Any,
    ) -> None:
        """verl's signature: `overlong_buffer_cfg` has `enable`, `len` and `penalty_factor` (an object or a dict,
        e.g. `config.reward_model.overlong_buffer`); None means no penalty. `max_resp_len` is the response limit."""
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **failure_settings)
        buffer = overlong_buffer_cfg if overlong_buffer_cfg is not None else {}

        def setting(key: str, default: Any) -> Any:
            return buffer.get(key, default) if isinstance(buffer, dict) else getattr(buffer, key, default)

        enable_overlong_buffer, overlong_buffer_len = bool(setting("enable", False)), int(setting("len", 0))
        penalty_factor, max_response_length = float(setting("penalty_factor", 1.0)), max_resp_len
        valid_buffer = max_response_length is not None and 0 < overlong_buffer_len <= max_response_length
        if enable_overlong_buffer and not valid_buffer:
            raise ValueError(
                f"reward_model.overlong_buffer.len={overlong_buffer_len} must be in (0, data.max_response_length="
                f"{max_response_length}] when overlong_buffer.enable=True; e.g. a quarter of max_response_length."
            )
        self.enable_overlong_buffer = enable_overlong_buffer
        self.max_response_length = max_response_length
        self.overlong_buffer_len, self.penalty_factor = overlong_buffer_len, penalty_factor

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, num_examine: int, compute_score: Any) -> DAPORewardManager:
        return cls(
            tokenizer,
            num_examine,
            compute_score,
            config.data.reward_fn_key,
            max_resp_len=config.data.max_response_length,
            overlong_buffer_cfg=config.reward_model.overlong_buffer,
            **cls.failure_settings(config),
        )

    def score(self, batch: ScoringBatch) -> list[float | dict[str, Any]]:
        results = super().score(batch)
        if not self.enable_overlong_buffer:
            return results
        assert self.max_response_length is not None
        shaped = []
        for result, length in zip(results, batch.response_lengths):
            value = dict(result) if isinstance(result, dict) else {"score": float(result)}
            penalty = overlong_penalty(length, self.max_response_length, self.overlong_buffer_len, self.penalty_factor)
            value["score"] = float(value["score"]) + penalty
            shaped.append({**value, "overlong_reward": penalty, "overlong": float(penalty < 0)})
        return shaped
