"""Batch balancing across data-parallel ranks: equal row counts, near-optimal token totals, rows kept whole; and
generation balancing across engines: whole prompt groups per engine, outputs back in the batch order."""

import random

import numpy as np
import pytest
import torch

from hyflow import fields as F
from hyflow.engine.parallel import EnginePlacement
from hyflow.protocol import DataProto
from hyflow.trainer.balance import balance_batch, balance_prompts, balanced_partitions, generate_balanced


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


def _prompt_batch(prompt_lengths: list[int], n: int) -> DataProto:
    """The trainer's generation input: each prompt repeated n times in a row, left-padded; row i's first input id is
    its prompt's index (so a row can be traced to its prompt)."""
    width = max(prompt_lengths)
    mask = torch.tensor([[0] * (width - length) + [1] * length for length in prompt_lengths])
    ids = torch.arange(len(prompt_lengths))[:, None].expand(-1, width).clone()
    data = DataProto.from_dict({F.INPUT_IDS: ids, F.ATTENTION_MASK: mask})
    return data.repeat(n, interleave=True)


class _EchoWorkers:
    """A worker group of `world_size` ranks whose generation returns each row's input ids as its response and
    records which prompts each rank got (DP_COMPUTE_PROTO's contiguous chunks)."""

    def __init__(self, world_size: int) -> None:
        self.world_size, self.prompts_by_rank = world_size, []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.prompts_by_rank = [chunk.batch[F.INPUT_IDS][:, 0].tolist() for chunk in prompts.chunk(self.world_size)]
        return DataProto.from_dict({F.RESPONSES: prompts.batch[F.INPUT_IDS].clone()}, meta_info={F.METRICS: {}})


def test_generation_gives_each_engine_whole_prompt_groups_with_similar_prompt_tokens():
    lengths, n = [40, 35, 30, 25, 10, 8, 5, 3], 2
    data = _prompt_batch(lengths, n)
    placement = EnginePlacement(world_size=4, tp_size=2)  # 2 engines of 2 ranks
    balanced, permutation, metrics = balance_prompts(data, placement, group_size=n)
    engines = [balanced.batch[F.INPUT_IDS][half * 8 : (half + 1) * 8, 0].tolist() for half in range(2)]
    for prompts in engines:
        assert all(prompts.count(p) == n for p in set(prompts))  # every prompt's samples on one engine
    assert sorted(p for prompts in engines for p in set(prompts)) == list(range(8))
    totals = [sum(lengths[p] for p in set(prompts)) for prompts in engines]
    assert metrics["rollout/engine_prompt_tokens_balanced_max"] == max(totals) * n
    assert max(totals) - min(totals) <= 2  # 130 vs 26 prompt tokens in the batch order
    assert metrics["rollout/engine_prompt_tokens_max"] - metrics["rollout/engine_prompt_tokens_min"] == (130 - 26) * n
    assert torch.equal(balanced.batch[F.INPUT_IDS], data.batch[F.INPUT_IDS][torch.from_numpy(permutation)])


def test_balanced_generation_returns_the_rows_in_the_batch_order():
    data = _prompt_batch([12, 9, 7, 5, 4, 3, 2, 1], n=2)
    workers = _EchoWorkers(world_size=4)
    output = generate_balanced(workers, data, tp_size=1, group_size=2)
    assert torch.equal(output.batch[F.RESPONSES], data.batch[F.INPUT_IDS])
    assert workers.prompts_by_rank != [[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5], [6, 6, 7, 7]]  # it did reorder
    assert "rollout/engine_prompt_tokens_balanced_max" in output.meta_info[F.METRICS]


def test_one_engine_or_rows_that_do_not_split_leave_the_generation_batch_as_it_is():
    data = _prompt_batch([5, 1, 3], n=2)
    assert balance_prompts(data, EnginePlacement(world_size=2, tp_size=2), group_size=2)[0] is data  # one engine
    assert balance_prompts(data, EnginePlacement(world_size=4), group_size=2)[0] is data  # 6 rows over 4 ranks
    assert balance_prompts(data, EnginePlacement(world_size=4, tp_size=2), group_size=2)[0] is data  # 2 engines
    rows, _, metrics = balance_prompts(data, EnginePlacement(world_size=2), group_size=2)  # 3 groups, 2 engines
    assert metrics and sorted(rows.batch[F.INPUT_IDS][:, 0].tolist()) == [0, 0, 1, 1, 2, 2]  # single rows balanced
