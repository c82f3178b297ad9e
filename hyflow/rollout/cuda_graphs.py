"""CUDA graphs for decode steps: one graph per (batch size, block count) bucket, captured on first use.

A decode step of B sequences is padded up to the next batch size of the ladder (1, 2, 4, 8, 16, 24, 32, ... up to
`cuda_graph_max_batch`) and its block tables up to the next power of two of blocks, then replays the graph captured
for that bucket. Padded rows write their K/V to the scratch block and their logits are dropped. All graphs share
one memory pool and one set of static input buffers (views of the largest size).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from hyflow.rollout.attention import AttentionMetadata
from hyflow.rollout.config import EngineConfig

if TYPE_CHECKING:
    from hyflow.rollout.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def batch_size_ladder(max_batch: int) -> list[int]:
    ladder = [1, 2, 4, 8, *list(range(16, max_batch + 1, 16))]
    return sorted({b for b in ladder if b <= max_batch} | {max_batch})


class DecodeGraphs:
    def __init__(self, runner: ModelRunner, config: EngineConfig) -> None:
        self.runner = runner
        self.max_batch = min(config.cuda_graph_max_batch, config.max_num_seqs)
        self.ladder = batch_size_ladder(self.max_batch)
        self.max_blocks = -(-config.max_model_len // config.block_size)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        device, long = runner.device, torch.long
        self.input_ids = torch.zeros(self.max_batch, dtype=long, device=device)
        self.positions = torch.zeros(self.max_batch, dtype=long, device=device)
        self.slot_mapping = torch.zeros(self.max_batch, dtype=long, device=device)
        self.block_tables = torch.zeros(self.max_batch, self.max_blocks, dtype=long, device=device)
        self.arange = torch.arange(self.max_batch, dtype=long, device=device)

    def fits(self, batch: int, meta: AttentionMetadata) -> bool:
        return batch <= self.max_batch and meta.block_tables.shape[1] <= self.max_blocks

    def clear(self) -> None:
        """Drops the graphs (they hold the KV cache's addresses, which change when it is freed)."""
        self.graphs.clear()
        self.pool = None

    def _bucket(self, batch: int, num_blocks: int) -> tuple[int, int]:
        padded_batch = next(b for b in self.ladder if b >= batch)
        padded_blocks = min(1 << max(num_blocks - 1, 0).bit_length(), self.max_blocks)
        return padded_batch, padded_blocks

    def _meta(self, batch: int, num_blocks: int) -> AttentionMetadata:
        rows = self.arange[:batch]
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:batch],
            block_tables=self.block_tables[:batch, :num_blocks],
            query_index=rows.unsqueeze(1),
            query_positions=self.positions[:batch].unsqueeze(1),
            token_index=rows,
            logits_index=rows,
        )

    def _capture(self, batch: int, num_blocks: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        logger.info("capturing a CUDA graph for decode batch %d x %d blocks", batch, num_blocks)
        meta = self._meta(batch, num_blocks)
        ids, positions = self.input_ids[:batch], self.positions[:batch]
        self.runner.forward(ids, positions, meta)  # warm-up outside the graph
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.runner.forward(ids, positions, meta)
        if self.pool is None:
            self.pool = graph.pool()
        torch.cuda.synchronize()
        return graph, logits

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Logits (B, V) of one decode step, through the graph of its bucket."""
        batch, num_blocks = meta.block_tables.shape
        padded_batch, padded_blocks = self._bucket(batch, num_blocks)
        scratch = self.runner.kv_cache.scratch_block
        self.input_ids[batch:padded_batch].zero_()
        self.positions[batch:padded_batch].zero_()
        self.slot_mapping[batch:padded_batch].fill_(scratch * self.runner.block_size)
        self.block_tables[:padded_batch, :padded_blocks].fill_(scratch)
        self.input_ids[:batch].copy_(input_ids)
        self.positions[:batch].copy_(positions)
        self.slot_mapping[:batch].copy_(meta.slot_mapping)
        self.block_tables[:batch, :num_blocks].copy_(meta.block_tables)
        key = (padded_batch, padded_blocks)
        if key not in self.graphs:
            self.graphs[key] = self._capture(padded_batch, padded_blocks)
        graph, logits = self.graphs[key]
        graph.replay()
        return logits[:batch]
