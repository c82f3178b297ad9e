"""Advantages when one agent session yields several trajectories (rows): only each session's final row is scored.

An agent loop that rewrites its context (summarises, restarts a sub-agent) returns several outputs for one sample;
each is a row, keyed `"{uid}_{session_id}_{index}"` (index counts the outputs of the session). GRPO compares the
*final* output of each session with the other sessions of the same prompt (`uid`), and every row of a session gets
that session's advantage on its own response tokens:

    A_row,t = A_final(session(row)) · response_mask_row,t

Other estimators (GAE, ...) see every row as it is (`compute_advantage`).

    data = compute_advantage_for_multi_trajectories(data, batch_keys, adv_estimator="grpo")

Shape legend: B = rows, R = response length.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch

from hyflow import fields as F
from hyflow.algorithms import AdvantageEstimator
from hyflow.protocol import DataProto
from hyflow.trainer.ppo_ops import compute_advantage, compute_response_mask

__all__ = ["compute_advantage", "compute_advantage_for_multi_trajectories", "final_rows_of_sessions"]

_SESSION_ESTIMATORS = {AdvantageEstimator.GRPO, AdvantageEstimator.GRPO_VECTORIZED}


def final_rows_of_sessions(batch_keys: list[str]) -> tuple[list[int], list[int]]:
    """(the row of each session's last output, in order of first appearance; for each row, the position of its
    session in that list). Keys are `"{uid}_{session_id}_{index}"`; the uid may itself contain underscores."""
    final: dict[str, tuple[int, int]] = {}  # session -> (output index, row)
    sessions = []
    for row, key in enumerate(batch_keys):
        uid_session, _, index = key.rpartition("_")
        if not uid_session or "_" not in uid_session or not index.isdigit():
            raise ValueError(
                f"batch_keys[{row}]={key!r} is not '{{uid}}_{{session_id}}_{{index}}' (index an integer), "
                "the key an agent loop gives each output of a session. Fix: build the keys in that form."
            )
        sessions.append(uid_session)
        if uid_session not in final or final[uid_session][0] < int(index):
            final[uid_session] = (int(index), row)
    position = {session: i for i, session in enumerate(final)}
    return [row for _, row in final.values()], [position[session] for session in sessions]


def compute_advantage_for_multi_trajectories(
    data: DataProto,
    batch_keys: list[str],
    adv_estimator: str | Enum,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> DataProto:
    """`advantages` and `returns` (B, R) of `data`, one key of `batch_keys` per row (formula in the module
    docstring). For estimators other than GRPO the rows are scored as they are (`compute_advantage`)."""
    kwargs = dict(gamma=gamma, lam=lam, num_repeat=num_repeat, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    if str(adv_estimator) not in {str(name) for name in _SESSION_ESTIMATORS}:
        return compute_advantage(data, adv_estimator=adv_estimator, config=config, **kwargs)
    if len(batch_keys) != len(data):
        raise ValueError(f"batch_keys has {len(batch_keys)} keys for {len(data)} rows; give one key per row.")
    final_rows, session_of_row = final_rows_of_sessions(batch_keys)
    finals = compute_advantage(data.select_idxs(final_rows), adv_estimator=adv_estimator, config=config, **kwargs)
    first_token = finals.batch[F.RESPONSE_MASK].argmax(dim=1)  # GRPO's advantage is one value per response
    session_advantage = finals.batch[F.ADVANTAGES][torch.arange(len(finals)), first_token]
    if F.RESPONSE_MASK not in data.batch.keys():  # noqa: SIM118 (older tensordicts reject `in td`)
        data.batch[F.RESPONSE_MASK] = compute_response_mask(data)
    response_mask = data.batch[F.RESPONSE_MASK]
    advantages = session_advantage[session_of_row].unsqueeze(-1) * response_mask
    data.batch[F.ADVANTAGES] = advantages
    data.batch[F.RETURNS] = advantages.clone()
    return data
