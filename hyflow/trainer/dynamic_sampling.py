"""DAPO's dynamic sampling (`algorithm.filter_groups`): train only on groups whose samples disagree.

A group is the n responses to one prompt (same `uid`). When all n get the same score, a group-relative advantage
(GRPO & co.) is zero for every one of them, so the group adds no gradient but still dilutes the batch. DAPO (Yu et
al. 2025, arXiv:2503.14476, Sec. 3.2) drops such groups and generates more prompts until the batch is full:

    sampler = GroupFilter(metric="acc", train_batch_size=32, n=8, max_num_gen_batches=10)
    for gen_batch in dataloader:
        batch = generate_and_score(gen_batch)
        full = sampler.add(batch)          # None: keep generating
        if full is None:
            continue
        train_on(full)                     # exactly train_batch_size groups of n rows

The metric is read per row from `token_level_rewards` summed over tokens (`seq_final_reward`),
`token_level_scores` summed (`seq_reward`), or a per-row value the reward function returned (e.g. `acc`, `score`)
in `non_tensor_batch`. A group of one sample is always kept (its variance is undefined, not zero).
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np

from hyflow import fields as F
from hyflow.config import PPOTrainerConfig
from hyflow.protocol import DataProto

__all__ = ["GroupFilter", "filter_groups", "group_metric_values"]

logger = logging.getLogger(__name__)

SEQUENCE_METRICS = {"seq_final_reward": F.TOKEN_LEVEL_REWARDS, "seq_reward": F.TOKEN_LEVEL_SCORES}


def group_metric_values(batch: DataProto, metric: str) -> np.ndarray:
    """The value of `metric` for each row, (B,) float64."""
    if metric in SEQUENCE_METRICS:
        key = SEQUENCE_METRICS[metric]
        if batch.batch is not None and key in batch.batch.keys():  # noqa: SIM118 (older tensordict: no `in`)
            return batch.batch[key].sum(-1).double().cpu().numpy()
    elif metric in batch.non_tensor_batch:
        return batch.non_tensor_batch[metric].astype(np.float64)
    available = sorted(SEQUENCE_METRICS) + sorted(batch.non_tensor_batch)
    raise ValueError(
        f"algorithm.filter_groups.metric={metric!r} is not available in the batch. Available: {available}. Use "
        f"seq_reward / seq_final_reward, or a key the reward function returns for every sample (e.g. 'acc')."
    )


def filter_groups(batch: DataProto, metric: str) -> tuple[DataProto, int, int]:
    """Keep the rows of groups (same `uid`) whose `metric` varies; return (kept rows, kept groups, all groups).

    Rows keep their order. A group of one row is kept.
    """
    if F.UID not in batch.non_tensor_batch:
        raise ValueError(f"algorithm.filter_groups needs non_tensor_batch['{F.describe(F.UID)}'] to find the groups.")
    values = group_metric_values(batch, metric)
    rows_of: dict[object, list[int]] = defaultdict(list)
    for row, uid in enumerate(batch.non_tensor_batch[F.UID]):
        rows_of[uid].append(row)
    kept_uids = {uid for uid, rows in rows_of.items() if len(rows) == 1 or np.std(values[rows]) > 0}
    keep = np.array([uid in kept_uids for uid in batch.non_tensor_batch[F.UID]], dtype=bool)
    return batch[keep], len(kept_uids), len(rows_of)


class GroupFilter:
    """Accumulate the kept groups of several generation batches until `train_batch_size` groups are ready.

    `max_num_gen_batches` bounds the generation batches per training batch (0: no bound); reaching it with too
    few groups raises a ValueError that says how many groups were found and what to change.
    """

    def __init__(self, metric: str, train_batch_size: int, n: int, max_num_gen_batches: int = 0) -> None:
        if max_num_gen_batches < 0:
            raise ValueError(
                f"algorithm.filter_groups.max_num_gen_batches={max_num_gen_batches}: must be >= 0 (0: no limit)."
            )
        self.metric = metric
        self.train_batch_size = train_batch_size
        self.n = n
        self.max_num_gen_batches = max_num_gen_batches
        self._parts: list[DataProto] = []
        self.num_groups = 0
        self.num_gen_batches = 0
        self.num_groups_seen = 0
        self.last_metrics: dict[str, float] = {}  # of the last full batch: generation batches used, kept ratio

    @classmethod
    def from_config(cls, config: PPOTrainerConfig) -> GroupFilter | None:
        """The filter `algorithm.filter_groups` asks for (`data.train_batch_size` groups of `rollout.n`), or None
        when it is not enabled."""
        filter_groups = config.algorithm.filter_groups
        if not filter_groups.enable:
            return None
        rollout_n, prompts = config.actor_rollout_ref.rollout.n, config.data.train_batch_size
        return cls(filter_groups.metric, prompts, rollout_n, filter_groups.max_num_gen_batches)

    def add(self, batch: DataProto) -> DataProto | None:
        """Filter `batch` and keep its useful groups; return the full training batch once there are enough groups.

        The returned batch holds the first `train_batch_size` kept groups (train_batch_size · n rows); the groups
        beyond them are dropped, and the filter starts over for the next training batch.
        """
        kept, num_kept, num_groups = filter_groups(batch, self.metric)
        self.num_gen_batches += 1
        self.num_groups_seen += num_groups
        if len(kept) > 0:
            self._parts.append(kept)
            self.num_groups += num_kept
        if self.num_groups < self.train_batch_size:
            if self.max_num_gen_batches and self.num_gen_batches >= self.max_num_gen_batches:
                self._raise_limit_reached()
            logger.info(
                "dynamic sampling: %d/%d groups with varying %s after %d generation batches; generating more",
                self.num_groups,
                self.train_batch_size,
                self.metric,
                self.num_gen_batches,
            )
            return None
        # Rows from several generation batches: their meta_info (seed, per-row token counts) differs, so the rows
        # are joined alone and the first batch's settings kept; the trainer recounts the tokens of the kept rows.
        rows = [DataProto(batch=part.batch, non_tensor_batch=part.non_tensor_batch) for part in self._parts]
        full = DataProto.concat(rows)[: self.train_batch_size * self.n]
        full.meta_info = dict(self._parts[0].meta_info)
        self.last_metrics = {
            "train/num_gen_batches": float(self.num_gen_batches),
            "train/kept_group_ratio": self.num_groups / max(self.num_groups_seen, 1),
        }
        self._reset()
        return full

    def _reset(self) -> None:
        self._parts, self.num_groups, self.num_gen_batches, self.num_groups_seen = [], 0, 0, 0

    def _raise_limit_reached(self) -> None:
        found, batches, wanted = self.num_groups, self.num_gen_batches, self.train_batch_size
        self._reset()
        raise ValueError(
            f"dynamic sampling found only {found} of data.train_batch_size={wanted} groups whose "
            f"'{self.metric}' varies after algorithm.filter_groups.max_num_gen_batches={batches} generation batches. "
            f"Raise max_num_gen_batches (0 means no limit), raise rollout.n or the sampling temperature, lower "
            f"data.train_batch_size, or use data that is neither always solved nor never solved."
        )
