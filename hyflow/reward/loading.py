"""From config to a ready reward manager, and the controller's one-line reward call.

    reward_fn = load_reward_manager(config, tokenizer, num_examine=0)       # checked at start-up
    reward_tensor, reward_extra_info = compute_reward(batch, reward_fn)     # (B, R), {key: [per-row values]}

Which scoring function the manager calls: `reward_model.reward_functions` (a weighted sum), else
`custom_reward_function.path/name` (a user's file), else the built-in scorer of each row's data source.
"""

from __future__ import annotations

from typing import Any

import torch

from hyflow.protocol import DataProto
from hyflow.reward.custom import load_custom_function
from hyflow.reward.managers import RewardManager, get_reward_manager_cls
from hyflow.reward.weighted import build_weighted_score


def _per_row(fn: Any) -> Any:
    """Adapt a per-response function to the batch manager's list signature."""

    def batched(data_sources, solution_strs, ground_truths, extra_infos):
        return [
            fn(data_source=source, solution_str=solution, ground_truth=truth, extra_info=extra)
            for source, solution, truth, extra in zip(data_sources, solution_strs, ground_truths, extra_infos)
        ]

    return batched


def build_compute_score(config: Any, batched: bool = False) -> Any:
    """The scoring function the config asks for, or None for the built-in scorers (`config`: PPOTrainerConfig)."""
    functions = config.reward_model.reward_functions
    custom = config.custom_reward_function
    if functions and custom.path is not None:
        raise ValueError(
            f"reward_model.reward_functions ({len(functions)} entries) and custom_reward_function.path="
            f"{custom.path!r} are both set; use one: put the custom function in reward_functions with a weight."
        )
    if functions:
        weighted = build_weighted_score(functions)
        return _per_row(weighted) if batched else weighted
    if custom.path is not None:
        return load_custom_function(custom.path, custom.name, custom.reward_kwargs, batched=batched)
    return None


def load_reward_manager(config: Any, tokenizer: Any, num_examine: int = 0) -> RewardManager:
    """The manager named by `reward_model.reward_manager`, with its scoring function loaded and checked."""
    manager_cls = get_reward_manager_cls(config.reward_model.reward_manager)
    compute_score = build_compute_score(config, batched=manager_cls.batched)
    return manager_cls.from_config(config, tokenizer, num_examine, compute_score)


def compute_reward(data: DataProto, reward_fn: RewardManager) -> tuple[torch.Tensor, dict[str, list]]:
    """(token_level_scores (B, R), reward_extra_info) for a batch, as the trainer stores them."""
    result = reward_fn(data, return_dict=True)
    assert isinstance(result, dict)
    return result["reward_tensor"], result["reward_extra_info"]
