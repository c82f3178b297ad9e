"""Batch balancing across data-parallel ranks: equal row counts, near-optimal token totals, rows kept whole."""

import random

import numpy as np
import pytest
import torch

from hyflow import fields as F
from hyflow.protocol import DataProto
from hyflow.trainer.balance import balance_batch, balanced_partitions


def _spread(parts: list[list[int]], lengths: list[int]) -> int:
    totals = [sum(lengths[i] for i in part) for part in parts]
    return max(totals) - min(totals)


def _brute_force_best_spread(lengths: list[int], k: int) -> int:
    """The optimal spread over every equal-size assignment (naive search, tiny inputs only)."""
    capacity, best = len(lengths) // k, [None]

    def assign(i: int, parts: list[list[int]]) -> None:
        if i == len(lengths):
            spread = _spread(parts, lengths)
            best[0] = spread if best[0] is None else min(best[0], spread)
            return
        for part in parts:
            if len(part) < capacity:
                part.append(i)
                assign(i + 1, parts)
                part.pop()
                if not part:  # empty parts are interchangeable
                    break

    assign(0, [[] for _ in range(k)])
    return best[0]


@pytest.mark.parametrize("method", ["karmarkar_karp", "greedy"])
def test_every_rank_gets_the_same_number_of_rows_and_every_row_once(method):
    lengths = [5, 90, 3, 44, 17, 8, 61, 2, 30]
    parts = balanced_partitions(lengths, 3, method)
    assert [len(part) for part in parts] == [3, 3, 3]
    assert sorted(i for part in parts for i in part) == list(range(9))


def test_karmarkar_karp_finds_the_perfect_split_of_one_to_eight():
    lengths = list(range(1, 9))
    parts = balanced_partitions(lengths, 2)
    assert _spread(parts, lengths) == 0


def test_karmarkar_karp_stays_within_one_row_of_the_brute_force_optimum():
    rng = random.Random(0)
    for _ in range(40):
        k = rng.choice([2, 3])
        lengths = [rng.randint(1, 100) for _ in range(k * rng.choice([2, 3]))]
        optimum = _brute_force_best_spread(lengths, k)
        assert optimum <= _spread(balanced_partitions(lengths, k), lengths) <= optimum + max(lengths)


def test_rows_that_do_not_divide_over_the_ranks_are_rejected_with_the_fix():
    with pytest.raises(ValueError, match=r"trainer\.balance_batch=False"):
        balanced_partitions([1, 2, 3], 2)


def test_unknown_method_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="karmarkar_karp"):
        balanced_partitions([1, 2], 1, method="random")


def _batch(lengths: list[int], width: int = 12) -> DataProto:
    attention = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        attention[row, :length] = 1
    uids = np.array([f"u{row}" for row in range(len(lengths))], dtype=object)
    return DataProto.from_dict(
        {F.ATTENTION_MASK: attention, F.INPUT_IDS: torch.arange(len(lengths)).unsqueeze(-1).expand(-1, width)},
        {F.UID: uids},
    )


def test_balance_batch_moves_whole_rows_and_evens_out_the_chunks():
    lengths = [12, 11, 10, 9, 1, 2, 3, 4]
    data = _batch(lengths)
    balanced, permutation, metrics = balance_batch(data, world_size=2)
    assert torch.equal(balanced.batch[F.INPUT_IDS][:, 0], torch.from_numpy(permutation))
    assert list(balanced.non_tensor_batch[F.UID]) == [f"u{i}" for i in permutation]
    chunk_tokens = [int(chunk.batch[F.ATTENTION_MASK].sum()) for chunk in balanced.chunk(2)]
    assert abs(chunk_tokens[0] - chunk_tokens[1]) <= 2
    assert metrics["global_seqlen/minmax_diff"] == (12 + 11 + 10 + 9) - (1 + 2 + 3 + 4)
    assert metrics["global_seqlen/balanced_max"] == max(chunk_tokens)
    assert metrics["global_seqlen/mean"] == sum(lengths) / 2
