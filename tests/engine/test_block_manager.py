"""The block manager: prefix blocks shared by hash with ref counts, freed blocks found again, the last block always
computed, token ids compared against hash collisions."""

from __future__ import annotations

from hyflow.engine.block_manager import BlockManager
from hyflow.engine.config import SamplingParams
from hyflow.engine.sequence import Sequence


def _seq(tokens: list[int]) -> Sequence:
    return Sequence("r", tokens, SamplingParams(), seed=0)


def test_sequences_with_a_common_prefix_share_its_full_blocks():
    manager = BlockManager(num_blocks=16, block_size=4)
    first, second = _seq(list(range(10))), _seq([*range(8), 50, 51, 52])
    manager.allocate(first)
    manager.allocate(second)
    assert first.block_table[:2] == second.block_table[:2] and first.block_table[2] != second.block_table[2]
    assert second.num_computed_tokens == 8 and first.num_computed_tokens == 0
    assert [manager.blocks[b].ref_count for b in first.block_table] == [2, 2, 1]
    manager.deallocate(first)
    assert [manager.blocks[b].ref_count for b in second.block_table] == [1, 1, 1]
    assert manager.num_free_blocks == 16 - 3


def test_a_freed_prefix_is_found_again_until_its_blocks_are_reused():
    manager = BlockManager(num_blocks=4, block_size=4)
    first = _seq(list(range(9)))
    manager.allocate(first)
    prefix_blocks = first.block_table[:2]
    manager.deallocate(first)
    again = _seq(list(range(9)))
    manager.allocate(again)
    assert again.num_computed_tokens == 8 and again.block_table[:2] == prefix_blocks
    manager.deallocate(again)
    manager.reset()
    fresh = _seq(list(range(9)))
    manager.allocate(fresh)
    assert fresh.num_computed_tokens == 0


def test_the_block_holding_the_last_prompt_token_is_always_computed():
    manager = BlockManager(num_blocks=8, block_size=4)
    first, second = _seq(list(range(8))), _seq(list(range(8)))
    manager.allocate(first)
    manager.allocate(second)
    assert second.num_computed_tokens == 4 and second.block_table[1] != first.block_table[1]


def test_prefix_caching_off_shares_nothing():
    manager = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    first, second = _seq(list(range(9))), _seq(list(range(9)))
    manager.allocate(first)
    manager.allocate(second)
    assert not set(first.block_table) & set(second.block_table) and second.num_computed_tokens == 0


def test_decode_appends_a_block_at_the_boundary_and_hashes_the_block_it_fills():
    manager = BlockManager(num_blocks=8, block_size=4)
    seq = _seq([1, 2, 3])
    manager.allocate(seq)
    seq.append(4, 0.0, None)  # the sampled token, stored at position 3 by the next decode step
    assert manager.can_append(seq)
    manager.append_slot(seq)
    assert len(seq.block_table) == 1 and manager.blocks[seq.block_table[0]].token_ids == (1, 2, 3, 4)
    seq.append(5, 0.0, None)
    manager.append_slot(seq)
    assert len(seq.block_table) == 2
    later = _seq([1, 2, 3, 4, 9])
    manager.allocate(later)
    assert later.num_computed_tokens == 4 and later.block_table[0] == seq.block_table[0]
