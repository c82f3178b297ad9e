"""Paged KV-cache bookkeeping: fixed-size blocks, per-sequence block tables, ref counts, and prefix sharing by hash.

A full block is identified by the hash of its tokens chained with the hash of the block before it, so equal hashes
mean equal prefixes (the token ids are compared too, against collisions). A block holding an image's pad tokens
adds the image's hash to its tokens (`Sequence.block_key`, multimodal.py): equal ids, different pictures, no hit.
When a sequence is admitted, its leading full blocks are looked up: a hit shares the block (ref count + 1) and
skips computing those tokens. The `n` samples
of one prompt are admitted in the same step and so share the prompt's blocks: the first writes them and, because
every layer stores all new K/V before any attention reads, the others read them in the same forward.

A freed block keeps its hash and content until it is handed out again (least recently freed first), so a prefix
that comes back later is still found. After a weight load every hash is forgotten (the K/V came from the old
weights); blocks that running sequences keep (`partial_rollout_kv="keep"`) are marked STALE: never found, never
hashed again, and they break the chain, so no block after them is found either.
"""

from __future__ import annotations

from collections import OrderedDict

from hyflow.engine.sequence import Sequence

NO_HASH = -1
STALE = -2  # K/V of weights loaded over since: a running sequence still reads them, no new one may share them


def chain_hash(prefix_hash: int, tokens: tuple[int, ...] | list[int]) -> int:
    return hash((prefix_hash, tuple(tokens)))


class Block:
    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash = NO_HASH
        self.token_ids: tuple[int, ...] = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block_id: dict[int, int] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def reset(self) -> None:
        """Forgets every block's content (after the KV cache was freed). No sequence may hold blocks."""
        assert self.num_free_blocks == self.num_blocks, "reset with sequences still holding blocks"
        for block in self.blocks:
            block.hash, block.token_ids = NO_HASH, ()
        self.hash_to_block_id.clear()

    def forget_prefixes(self, kept: list[Sequence]) -> None:
        """After a weight load: no block is found by prefix any more; the blocks of the `kept` sequences (which
        continue on their cached K/V) become STALE."""
        self.hash_to_block_id.clear()
        for block in self.blocks:
            block.hash, block.token_ids = NO_HASH, ()
        for seq in kept:
            for block_id in seq.block_table:
                self.blocks[block_id].hash = STALE

    def _take_free_block(self) -> Block:
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash != NO_HASH and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
        block.hash, block.token_ids, block.ref_count = NO_HASH, (), 1
        return block

    def _register(self, block: Block, block_hash: int, tokens: tuple[int, ...]) -> None:
        block.hash, block.token_ids = block_hash, tuple(tokens)
        if self.enable_prefix_caching:
            self.hash_to_block_id[block_hash] = block.block_id

    def _lookup(self, block_hash: int, tokens: tuple[int, ...]) -> Block | None:
        block_id = self.hash_to_block_id.get(block_hash)
        if block_id is None or self.blocks[block_id].token_ids != tuple(tokens):
            return None
        return self.blocks[block_id]

    def can_allocate(self, seq: Sequence) -> bool:
        """Conservative: enough free blocks even if nothing is shared."""
        return self.num_free_blocks >= seq.num_blocks(self.block_size)

    def allocate(self, seq: Sequence) -> None:
        """Gives a waiting sequence its block table, sharing cached full blocks of its prefix."""
        assert not seq.block_table
        prefix_hash, cache_miss = NO_HASH, not self.enable_prefix_caching
        seq.num_computed_tokens = 0
        for index in range(seq.num_blocks(self.block_size)):
            full = (index + 1) * self.block_size <= len(seq)
            key = seq.block_key(index, self.block_size) if full else ()  # token ids (+ image hashes)
            block_hash = chain_hash(prefix_hash, key) if full else NO_HASH
            # Never take the block of the last token from the cache: its logits must be computed.
            is_last = (index + 1) * self.block_size >= len(seq)
            hit = None if cache_miss or not full or is_last else self._lookup(block_hash, key)
            if hit is None:
                cache_miss = True
                block = self._take_free_block()
                if full:
                    self._register(block, block_hash, key)
            else:
                block = hit
                if block.ref_count == 0:
                    del self.free_block_ids[block.block_id]
                block.ref_count += 1
                seq.num_computed_tokens += self.block_size
            seq.block_table.append(block.block_id)
            prefix_hash = block_hash

    def deallocate(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        seq.block_table = []
        seq.num_computed_tokens = 0

    def can_append(self, seq: Sequence) -> bool:
        """Whether the next decode step (which stores the token at position len-1) finds room."""
        needs_block = seq.num_tokens > len(seq.block_table) * self.block_size
        return not needs_block or self.num_free_blocks >= 1

    def num_blocks_to_reserve(self, seq: Sequence, num_steps: int) -> int:
        """New blocks a decode window of `num_steps` steps needs: it stores positions len-1 .. len+num_steps-2."""
        needed = -(-(seq.num_tokens + num_steps - 1) // self.block_size)
        return max(0, needed - len(seq.block_table))

    def reserve_slots(self, seq: Sequence, num_steps: int) -> None:
        """Before a decode window: blocks for the K/V of every token the window feeds (see `num_blocks_to_reserve`).
        Their hashes are registered after the window, once the tokens are known (`register_filled_blocks`)."""
        self.append_blocks(seq, self.num_blocks_to_reserve(seq, num_steps))

    def append_blocks(self, seq: Sequence, count: int) -> None:
        """Gives a running sequence `count` free blocks at the end of its table (no free-block check)."""
        for _ in range(count):
            seq.block_table.append(self._take_free_block().block_id)

    def register_filled_blocks(self, seq: Sequence, start: int) -> None:
        """After a decode window that computed positions start .. num_computed_tokens-1: hash the blocks it filled,
        so a later request with this prefix finds them (as `append_slot` does for a single step)."""
        for index in range(start // self.block_size, seq.num_computed_tokens // self.block_size):
            if not self._hash_full_block(seq, index):
                return  # the chain is broken (an unhashed block before): nothing after it can be found

    def _hash_full_block(self, seq: Sequence, index: int) -> bool:
        """Registers the hash of the sequence's full block `index` when its prefix is hashed; False when it is not
        (a broken chain: the block cannot be found by prefix)."""
        block = self.blocks[seq.block_table[index]]
        if block.hash != NO_HASH:
            return block.hash != STALE
        prefix_hash = self.blocks[seq.block_table[index - 1]].hash if index > 0 else NO_HASH
        if index > 0 and prefix_hash in (NO_HASH, STALE):
            return False
        key = seq.block_key(index, self.block_size)
        self._register(block, chain_hash(prefix_hash, key), key)
        return True

    def append_slot(self, seq: Sequence) -> None:
        """Before a decode step: a new block if the token at len-1 starts one; hash the block it fills."""
        if seq.num_tokens > len(seq.block_table) * self.block_size:
            seq.block_table.append(self._take_free_block().block_id)
        if seq.num_tokens % self.block_size == 0:
            self._hash_full_block(seq, seq.num_tokens // self.block_size - 1)
