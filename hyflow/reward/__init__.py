"""Rewards: rule scorers (`hyflow.reward.scorers`), reward managers that turn a batch of responses into
`token_level_scores`, user functions from files, and weighted combinations.

    from hyflow.reward import load_reward_manager, compute_reward
    reward_fn = load_reward_manager(config, tokenizer)
    token_level_scores, reward_extra_info = compute_reward(batch, reward_fn)

Names are imported lazily, so a scorer module (e.g. in a scoring worker process) does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_reward_manager": "hyflow.reward.loading",
    "compute_reward": "hyflow.reward.loading",
    "build_compute_score": "hyflow.reward.loading",
    "RewardManager": "hyflow.reward.managers",
    "get_reward_manager_cls": "hyflow.reward.managers",
    "register_reward_manager": "hyflow.reward.managers",
    "load_custom_function": "hyflow.reward.custom",
    "default_compute_score": "hyflow.reward.scorers",
    "register_scorer": "hyflow.reward.scorers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hyflow.reward' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
