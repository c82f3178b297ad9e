"""Balance a batch across data-parallel ranks: reorder rows so every rank gets a similar number of tokens.

Worker groups give rank r the r-th contiguous chunk of the batch (`DataProto.chunk`), and a step lasts as long as
its slowest rank. `balance_batch` permutes the rows so that every chunk holds the same number of rows and a
similar total of tokens (`trainer.balance_batch=True`). The rows stay whole, so per-row fields and group ids
(`uid`) travel with them; group estimators find their groups by `uid`, not by position.

The partition is the Karmarkar–Karp largest differencing method (Karmarkar & Karp 1982; the k-way,
equal-cardinality form of Michiels et al. 2003, "Performance ratios for the differencing method"):

    sort the n lengths; cut them into n/k runs of k; each run is a partial solution with one row per rank
    while more than one partial solution remains:
        take the two with the largest spread (max rank total − min rank total)
        merge them by giving the heaviest rank of one the lightest rank of the other, and so on
    the last partial solution gives every rank exactly n/k rows

`method="greedy"` is the simpler longest-processing-time rule (each row, longest first, goes to the lightest rank
that still has room); Karmarkar–Karp usually leaves a smaller spread.

Generation is balanced over engines, not ranks (`generate_balanced`): with data-parallel rollout the worker group
holds `world / tp` engines (`EnginePlacement`: one per device, or one per TP group of consecutive ranks, which
generates the chunks of all its ranks). Its prompts are the trainer's `rollout.n`-fold repeat, so each prompt's
`n` rows are one unit: a unit stays on one engine, where its samples share the prompt's KV cache, and every
engine gets as many units with a similar total of prompt tokens (the responses' budget is the same for all rows).
The outputs come back in the batch's order.

    output = generate_balanced(workers.rollout, prompts, tp_size=tp, group_size=n)   # a worker group of world ranks
"""

from __future__ import annotations

import heapq
from typing import Any, Literal

import numpy as np
import torch

from hyflow import fields as F
from hyflow.engine.parallel import EnginePlacement
from hyflow.protocol import DataProto

__all__ = ["BALANCE_METHODS", "balance_batch", "balance_prompts", "balanced_partitions", "generate_balanced"]

BalanceMethod = Literal["karmarkar_karp", "greedy"]
BALANCE_METHODS = ("karmarkar_karp", "greedy")


class _PartialSolution:
    """k ranks, each with a token total and its row indices; ranks kept sorted by total, heaviest first."""

    def __init__(self, ranks: list[tuple[int, list[int]]]) -> None:
        self.ranks = sorted(ranks, key=lambda rank: (-rank[0], rank[1]))

    @property
    def spread(self) -> int:
        return self.ranks[0][0] - self.ranks[-1][0]

    def merge(self, other: _PartialSolution) -> _PartialSolution:
        """Pair this solution's heaviest rank with the other's lightest, second heaviest with second lightest, ..."""
        pairs = zip(self.ranks, reversed(other.ranks))
        return _PartialSolution([(a[0] + b[0], a[1] + b[1]) for a, b in pairs])


def _karmarkar_karp(lengths: list[int], k: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    heap: list[tuple[int, int, _PartialSolution]] = []
    for tie, start in enumerate(range(0, len(order), k)):
        solution = _PartialSolution([(lengths[i], [i]) for i in order[start : start + k]])
        heapq.heappush(heap, (-solution.spread, tie, solution))
    tie = len(heap)
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = first.merge(second)
        heapq.heappush(heap, (-merged.spread, tie, merged))
        tie += 1
    return [rows for _, rows in heap[0][2].ranks]


def _greedy(lengths: list[int], k: int) -> list[list[int]]:
    capacity = len(lengths) // k
    totals, parts = [0] * k, [[] for _ in range(k)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min((r for r in range(k) if len(parts[r]) < capacity), key=lambda r: (totals[r], r))
        totals[rank] += lengths[i]
        parts[rank].append(i)
    return parts


def balanced_partitions(lengths: list[int], k: int, method: BalanceMethod = "karmarkar_karp") -> list[list[int]]:
    """Split row indices 0..n-1 into k parts of n/k rows each with similar sums of `lengths`.

    Each part is sorted by row index, and the parts are ordered by their first row, so the result is deterministic.
    """
    if method not in BALANCE_METHODS:
        raise ValueError(f"balance method {method!r} is not known. Allowed values: {list(BALANCE_METHODS)}.")
    if len(lengths) % k != 0:
        raise ValueError(
            f"cannot balance {len(lengths)} rows over {k} data-parallel ranks with equal row counts: {len(lengths)} "
            f"is not a multiple of {k}. Make data.train_batch_size * actor_rollout_ref.rollout.n divisible by "
            f"trainer.nnodes * trainer.n_gpus_per_node, or set trainer.balance_batch=False."
        )
    parts = _karmarkar_karp(lengths, k) if method == "karmarkar_karp" else _greedy(lengths, k)
    return sorted((sorted(part) for part in parts), key=lambda part: part[0])


def _spread_metrics(prefix: str, totals: list[int]) -> dict[str, float]:
    return {f"{prefix}min": float(min(totals)), f"{prefix}max": float(max(totals))}


def balance_batch(
    data: DataProto, world_size: int, method: BalanceMethod = "karmarkar_karp"
) -> tuple[DataProto, np.ndarray, dict[str, float]]:
    """Reorder `data` so that `data.chunk(world_size)` gives every rank a similar number of tokens.

    The token count of a row is the sum of its `attention_mask` (prompt and response). Returns the reordered
    batch, the permutation (`balanced = data[permutation]`), and metrics: the per-rank token totals before
    (`global_seqlen/min`, `/max`, `/minmax_diff`) and after (`/balanced_min`, `/balanced_max`), and `/mean`.
    """
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: balancing needs at least one data-parallel rank.")
    lengths = data.batch[F.ATTENTION_MASK].sum(-1).tolist()  # one host sync, controller-side
    parts = balanced_partitions(lengths, world_size, method)
    permutation = np.fromiter((i for part in parts for i in part), dtype=np.int64, count=len(lengths))
    chunk = len(lengths) // world_size
    before = [sum(lengths[r * chunk : (r + 1) * chunk]) for r in range(world_size)]
    after = [sum(lengths[i] for i in part) for part in parts]
    metrics = _spread_metrics("global_seqlen/", before)
    metrics["global_seqlen/minmax_diff"] = float(max(before) - min(before))
    metrics.update(_spread_metrics("global_seqlen/balanced_", after))
    metrics["global_seqlen/mean"] = float(sum(lengths) / world_size)
    return data[torch.from_numpy(permutation)], permutation, metrics


def balance_prompts(
    data: DataProto, placement: EnginePlacement, group_size: int = 1
) -> tuple[DataProto, np.ndarray, dict[str, float]]:
    """Reorder a generation batch so that `data.chunk(placement.world_size)` gives every engine whole groups of
    `group_size` consecutive rows (a prompt's samples) and a similar total of prompt tokens (`attention_mask`).

    Returns the reordered batch, the permutation (`balanced = data[permutation]`) and metrics: the per-engine prompt
    tokens before (`rollout/engine_prompt_tokens_min`, `_max`) and after (`_balanced_min`, `_balanced_max`). The
    batch is returned as it is when there is one engine or when its rows do not split evenly over the ranks; groups
    that do not split evenly over the engines are balanced row by row."""
    rows = len(data)
    engines = placement.num_engines
    if engines == 1 or rows % placement.world_size:  # else the group pads the batch and its chunks move
        return data, np.arange(rows), {}
    lengths = data.batch[F.ATTENTION_MASK].sum(-1).tolist()  # one host sync, controller-side
    if group_size < 1 or rows % group_size or (rows // group_size) % engines:
        group_size = 1  # the groups cannot go whole to the engines in equal numbers: balance single rows
    units = [sum(lengths[start : start + group_size]) for start in range(0, rows, group_size)]
    parts = balanced_partitions(units, engines)
    permutation = np.fromiter(
        (unit * group_size + offset for part in parts for unit in part for offset in range(group_size)),
        dtype=np.int64,
        count=rows,
    )
    chunk = rows // engines
    before = [sum(lengths[e * chunk : (e + 1) * chunk]) for e in range(engines)]
    after = [sum(units[unit] for unit in part) for part in parts]
    metrics = {**_spread_metrics("rollout/engine_prompt_tokens_", before)}
    metrics.update(_spread_metrics("rollout/engine_prompt_tokens_balanced_", after))
    return data[torch.from_numpy(permutation)], permutation, metrics


def generate_balanced(workers: Any, prompts: DataProto, tp_size: int = 1, group_size: int = 1) -> DataProto:
    """`workers.generate_sequences(prompts)` (a worker group whose ranks form engines of `tp_size`) with the prompts
    spread over the engines by `balance_prompts`; the output rows come back in the order of `prompts`, with the
    balance metrics added to its `meta_info["metrics"]`."""
    placement = EnginePlacement(workers.world_size, tp_size)
    balanced, permutation, metrics = balance_prompts(prompts, placement, group_size)
    if not metrics:
        return workers.generate_sequences(prompts)
    output = workers.generate_sequences(balanced)
    restored = output[torch.from_numpy(np.argsort(permutation))]
    restored.meta_info[F.METRICS] = {**output.meta_info.get(F.METRICS, {}), **metrics}
    return restored
