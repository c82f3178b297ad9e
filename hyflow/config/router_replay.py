"""Load-time checks of `actor_rollout_ref.actor.router_replay` (routing replay of mixture-of-experts models).

R3 needs a rollout that records routing (hyflow's engine; `transformers.generate` cannot), and both modes need a
model with experts to route. The model check reads the folder's `config.json` (no weights); it runs with the other
file checks (`check_files`), and the embedded default (a dense tiny model) counts as dense.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_KEY = "actor_rollout_ref.actor.router_replay.mode"
# config.json keys that count a model's routed experts (Qwen-MoE, DeepSeek: num_experts / n_routed_experts; Mixtral)
_EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def is_mixture_of_experts(hf_config: dict[str, Any]) -> bool:
    """Whether a Hugging Face config (config.json's dict, or its `text_config`) has routed experts."""
    text = hf_config.get("text_config") or hf_config
    return any((text.get(key) or 0) > 0 for key in _EXPERT_COUNT_KEYS)


def check_router_replay(config: Any, check_files: bool) -> list[str]:
    """One message per problem of `router_replay.mode` with the rollout and the model (`config`: PPOTrainerConfig)."""
    mode = config.actor_rollout_ref.actor.router_replay.mode
    if mode == "disabled":
        return []
    problems = []
    rollout = config.actor_rollout_ref.rollout.name
    if mode == "R3" and rollout != "hyflow":
        problems.append(
            f"{_KEY}=R3 replays the routing the rollout engine recorded, but actor_rollout_ref.rollout.name="
            f"{rollout!r} (transformers.generate) records none. Fix: set actor_rollout_ref.rollout.name=hyflow, or "
            f"{_KEY}=R2 (replays the trainer's own old-log-prob routing)."
        )
    if check_files:
        path = config.actor_rollout_ref.model.path
        dense = _is_dense(path)
        if dense:
            where = "the embedded default model" if path is None else f"actor_rollout_ref.model.path={path!r}"
            problems.append(
                f"{_KEY}={mode} replays the routing of a mixture-of-experts model, but {where} is dense (its "
                f"config.json names no experts: {', '.join(_EXPERT_COUNT_KEYS)}). Fix: set {_KEY}=disabled, or "
                "train a MoE model (e.g. qwen3_moe, qwen2_moe, mixtral)."
            )
    return problems


def _is_dense(path: str | None) -> bool:
    """True when the model at `path` (None: the embedded default) has no experts; False when unknown (a hub id:
    the folder checks report a missing folder on their own)."""
    if path is None:
        return True
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return False
    return not is_mixture_of_experts(json.loads(config_file.read_text()))
