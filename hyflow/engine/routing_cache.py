"""The routing record: which experts each mixture-of-experts layer chose for every token the engine computed.

With `EngineConfig.record_routing` the engine keeps, beside the paged KV cache and at the same slots, the k expert
ids of every MoE layer:

    routing[layer, slot] = expert ids (k,),    slot = block_tables[pos // block_size] * block_size + pos % block_size

`SparseMoeBlock` writes them with `index_copy_` at the step's `slot_mapping` (device writes of fixed shape: they run
inside CUDA graphs and decode windows as they are; padded rows write the scratch block, as their K/V do). A token
computed once serves every sequence that shares its block: the n samples of a prompt (prefix sharing) and the next
turn of an agent (the cached prefix) have their prompt's routing without recomputing it. When a sequence ends, its
record is gathered through its block table: (num_computed_tokens, num_moe_layers, k), one row per token that went
through the model, prompt and response. The last sampled token never does (nothing is sampled after it): it has no
row, and a trainer replaying the record routes it itself (its routing changes no log-prob of a sampled token).

The cache is small (num_moe_layers · k bytes a token beside the KV cache's kilobytes), kept across sleep/wake (so
CUDA graphs keep its address) and never cleared: a slot is always written before it is read.
Shapes: S slots (the KV cache's blocks and its scratch block, times block_size), Lm MoE layers, k experts per token.
"""

from __future__ import annotations

import torch

# Ids of up to 255 experts fit a byte with one value to spare: the "no record" marker of `routed_experts`.
_BYTE_EXPERTS = 255


def routing_dtype(num_experts: int) -> torch.dtype:
    """The compact dtype of expert ids: uint8 for up to 255 experts, else int16 (the all-bits-set value of either,
    255 or -1, is `NO_RECORD`)."""
    return torch.uint8 if num_experts <= _BYTE_EXPERTS else torch.int16


def no_record_value(dtype: torch.dtype) -> int:
    """The marker of a token without a record in a `routed_experts` tensor of `dtype` (all bits set)."""
    return 255 if dtype == torch.uint8 else -1


def has_record(routed_experts: torch.Tensor) -> torch.Tensor:
    """Per token (every dimension but the last two), whether all its layers' expert ids are recorded."""
    marker = no_record_value(routed_experts.dtype)
    return (routed_experts != marker).flatten(-2).all(-1)


class RoutingCache:
    """The expert ids of every MoE layer at every KV cache slot: `data` (Lm, S, k); `layer(i)` is MoE layer i's
    (S, k) view, which its `SparseMoeBlock` writes."""

    def __init__(
        self, num_slots: int, num_moe_layers: int, top_k: int, num_experts: int, block_size: int, device: torch.device
    ) -> None:
        self.block_size = block_size
        self.data = torch.zeros(num_moe_layers, num_slots, top_k, dtype=routing_dtype(num_experts), device=device)

    def layer(self, index: int) -> torch.Tensor:
        return self.data[index]

    def read(self, block_table: list[int], num_tokens: int) -> torch.Tensor:
        """The record (num_tokens, Lm, k) on the host of positions 0..num_tokens-1 of a sequence with these cache
        blocks (a host sync: it waits for the steps queued before it)."""
        device = self.data.device
        blocks = torch.tensor(block_table, dtype=torch.long, device=device)
        offsets = torch.arange(self.block_size, device=device)
        slots = (blocks[:, None] * self.block_size + offsets).flatten()[:num_tokens]
        return self.data[:, slots].transpose(0, 1).cpu()
