"""CUDA graphs for decode steps: one graph per (batch size, block count) bucket, captured on first use.

A decode step of B sequences is padded up to the next batch size of the ladder (1, 2, 4, 8, 16, 24, 32, ... up to
`cuda_graph_max_batch`) and its block tables to the full `max_model_len` width (the Triton decode kernel reads only
each row's own blocks, so the width costs nothing; without Triton, the gathering attention pads to the next power of
two of blocks instead), then replays the graph captured for that bucket. Padded rows write their K/V to the scratch
block and their logits are dropped. All graphs share one memory pool and one set of static input buffers (views of
the largest size).

A decode window (multi_step.py) replays a second kind of graph, one whole step (forward, sample, record the outputs,
advance the inputs), K times in a row; it is keyed by the bucket and by the sampler's mode (top-k/top-p filtering,
raw log-probs), and captured from neutral inputs (every row on the scratch block) because the step changes its own
inputs.

Image sequences (mrope.py) decode with their rotary positions shifted by a per-row offset: their batches replay
graphs captured with the offset buffer added to the positions (the `mrope` flag of the keys); text batches replay
graphs without it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from hyflow.engine import triton_kernels
from hyflow.engine.attention import AttentionMetadata
from hyflow.engine.config import EngineConfig
from hyflow.engine.decode_state import DecodeState, Forward
from hyflow.engine.kv_cache import KVCache
from hyflow.engine.multi_step import decode_step
from hyflow.engine.sampler import SamplingTensors

logger = logging.getLogger(__name__)


def batch_size_ladder(max_batch: int) -> list[int]:
    ladder = [1, 2, 4, 8, *list(range(16, max_batch + 1, 16))]
    return sorted({b for b in ladder if b <= max_batch} | {max_batch})


class DecodeGraphs:
    def __init__(self, forward: Forward, kv_cache: KVCache, config: EngineConfig, device: torch.device) -> None:
        """`forward`: the eager forward whose launches a graph records (model_runner.ModelRunner.forward);
        `kv_cache`: the cache it reads, whose scratch block the padded rows write to."""
        self.forward, self.kv_cache, self.block_size = forward, kv_cache, config.block_size
        self.max_batch = min(config.cuda_graph_max_batch, config.max_num_seqs)
        self.ladder = batch_size_ladder(self.max_batch)
        self.max_blocks = -(-config.max_model_len // config.block_size)
        self.graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.window_graphs: dict[tuple[int, int, bool, bool, bool], torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.num_captures = 0  # graphs captured so far (a diagnostic: recaptures cost time)
        long, batch = torch.long, self.max_batch
        self.input_ids = torch.zeros(batch, dtype=long, device=device)
        self.positions = torch.zeros(batch, dtype=long, device=device)
        self.rope_offsets = torch.zeros(batch, dtype=long, device=device)  # image rows' rotary shift (mrope.py)
        self.slot_mapping = torch.zeros(batch, dtype=long, device=device)
        self.block_tables = torch.zeros(batch, self.max_blocks, dtype=long, device=device)
        self.arange = torch.arange(batch, dtype=long, device=device)
        # The rest of a decode window's state (multi_step.DecodeState) and its output buffers.
        self.max_steps = config.num_scheduler_steps
        self.steps_left = torch.zeros(batch, dtype=long, device=device)
        self.temperatures = torch.zeros(batch, dtype=torch.float32, device=device)
        self.top_p = torch.ones(batch, dtype=torch.float32, device=device)
        self.top_k = torch.full((batch,), -1, dtype=long, device=device)
        self.seeds = torch.zeros(batch, dtype=long, device=device)
        self.counters = torch.zeros(batch, dtype=long, device=device)
        self.step = torch.zeros(1, dtype=long, device=device)
        self.out_tokens = torch.zeros(batch, self.max_steps, dtype=long, device=device)
        self.out_log_probs = torch.zeros(batch, self.max_steps, dtype=torch.float32, device=device)
        self.out_raw_log_probs = torch.zeros(batch, self.max_steps, dtype=torch.float32, device=device)
        self._loaded_sampling: tuple[torch.Tensor, int] | None = None  # (temperatures loaded, padded batch)
        self.full_width_tables = triton_kernels.available()  # one block bucket: Triton decode attention

    def fits(self, batch: int, meta: AttentionMetadata) -> bool:
        return batch <= self.max_batch and meta.block_tables.shape[1] <= self.max_blocks

    def fits_window(self, batch: int, meta: AttentionMetadata, num_steps: int) -> bool:
        return self.fits(batch, meta) and num_steps <= self.max_steps

    def clear(self) -> None:
        """Drops the graphs (they hold the KV cache's addresses, which change when it is freed)."""
        self.graphs.clear()
        self.window_graphs.clear()
        self.pool = None

    def _bucket(self, batch: int, num_blocks: int) -> tuple[int, int]:
        padded_batch = next(b for b in self.ladder if b >= batch)
        if self.full_width_tables:
            return padded_batch, self.max_blocks
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

    def _record(self, fn: Callable[[], Any], prepare: Callable[[], None] = lambda: None) -> tuple[Any, Any]:
        """Captures `fn` in a CUDA graph (after a warm-up run outside it, which compiles the kernels); returns the
        graph and what `fn` returned (its static output tensors). `prepare` sets the inputs before each run."""
        prepare()
        fn()
        prepare()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        if self.pool is None:
            self.pool = graph.pool()
        torch.cuda.synchronize()
        self.num_captures += 1
        return graph, out

    def _capture(self, batch: int, num_blocks: int, mrope: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        logger.info("capturing a CUDA graph for decode batch %d x %d blocks", batch, num_blocks)
        meta = self._meta(batch, num_blocks)
        ids, positions, offsets = self.input_ids[:batch], self.positions[:batch], self.rope_offsets[:batch]
        return self._record(lambda: self.forward(ids, positions + offsets if mrope else positions, meta))

    def _pad_inputs(self, batch: int, padded_batch: int, padded_blocks: int) -> None:
        """Rows batch..padded_batch (and block-table columns past each row's blocks) point at the scratch block."""
        scratch = self.kv_cache.scratch_block
        self.input_ids[batch:padded_batch].zero_()
        self.positions[batch:padded_batch].zero_()
        self.rope_offsets[batch:padded_batch].zero_()
        self.slot_mapping[batch:padded_batch].fill_(scratch * self.block_size)
        self.block_tables[:padded_batch, :padded_blocks].fill_(scratch)

    def _load_inputs(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        padded: tuple[int, int],
        rope_offsets: torch.Tensor | None = None,
    ) -> None:
        """Copies a decode step's inputs into the static buffers, padded up to the bucket."""
        batch, num_blocks = meta.block_tables.shape
        self._pad_inputs(batch, *padded)
        self.input_ids[:batch].copy_(input_ids)
        self.positions[:batch].copy_(positions)
        if rope_offsets is not None:
            self.rope_offsets[:batch].copy_(rope_offsets)
        self.slot_mapping[:batch].copy_(meta.slot_mapping)
        self.block_tables[:batch, :num_blocks].copy_(meta.block_tables)

    def replay(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        rope_offsets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, V) of one decode step, through the graph of its bucket (`rope_offsets`: image rows' shift)."""
        batch, num_blocks = meta.block_tables.shape
        key = (*self._bucket(batch, num_blocks), rope_offsets is not None)
        self._load_inputs(input_ids, positions, meta, key[:2], rope_offsets)
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        graph, logits = self.graphs[key]
        graph.replay()
        return logits[:batch]

    # ---- decode windows -------------------------------------------------------------------------------------
    def _window_state(
        self, batch: int, num_blocks: int, need_filter: bool, need_raw: bool, mrope: bool = False
    ) -> DecodeState:
        """The static DecodeState of one bucket: views of the buffers."""
        sampling = SamplingTensors(
            temperatures=self.temperatures[:batch],
            top_k=self.top_k[:batch],
            top_p=self.top_p[:batch],
            seeds=self.seeds[:batch],
            counters=self.counters[:batch],
            need_filter=need_filter,
            need_raw=need_raw,
        )
        return DecodeState(
            input_ids=self.input_ids[:batch],
            positions=self.positions[:batch],
            slot_mapping=self.slot_mapping[:batch],
            block_tables=self.block_tables[:batch, :num_blocks],
            steps_left=self.steps_left[:batch],
            sampling=sampling,
            step=self.step,
            tokens=self.out_tokens[:batch],
            log_probs=self.out_log_probs[:batch],
            raw_log_probs=self.out_raw_log_probs[:batch] if need_raw else None,
            rows=self.arange[:batch],
            rope_offsets=self.rope_offsets[:batch] if mrope else None,
        )

    def _pad_sampling(self, batch: int, padded_batch: int) -> None:
        """Rows batch..padded_batch of a window are greedy and idle; the window starts at step 0."""
        self.temperatures[batch:padded_batch].zero_()
        self.top_k[batch:padded_batch].fill_(-1)
        self.top_p[batch:padded_batch].fill_(1.0)
        self.seeds[batch:padded_batch].zero_()
        self.counters[batch:padded_batch].zero_()
        self.steps_left[batch:padded_batch].zero_()
        self.step.zero_()

    def _load_sampling(self, sampling: SamplingTensors, steps_left: torch.Tensor, padded_batch: int) -> None:
        """Copies a window's sampling settings and step counts into the static buffers, padded up to the bucket.
        The per-row constants are skipped when they are the ones loaded last (the runner reuses them while the
        batch does not change); the windows only change counters, steps_left and step, set here every time."""
        batch, loaded = steps_left.shape[0], self._loaded_sampling
        if loaded is None or loaded[0] is not sampling.temperatures or loaded[1] != padded_batch:
            self._pad_sampling(batch, padded_batch)
            self.temperatures[:batch].copy_(sampling.temperatures)
            self.top_k[:batch].copy_(sampling.top_k)
            self.top_p[:batch].copy_(sampling.top_p)
            self.seeds[:batch].copy_(sampling.seeds)
            self._loaded_sampling = (sampling.temperatures, padded_batch)
        self.counters[:batch].copy_(sampling.counters)
        self.steps_left[:batch].copy_(steps_left)
        self.steps_left[batch:padded_batch].zero_()
        self.step.zero_()

    def _capture_window(self, key: tuple[int, int, bool, bool, bool]) -> torch.cuda.CUDAGraph:
        """Captures one window step for a bucket. The step advances its own inputs, so the warm-up and the capture
        start from neutral rows (all on the scratch block), never from a real window's inputs."""
        batch, num_blocks, need_filter, need_raw, mrope = key
        logger.info("capturing a CUDA graph for a decode-window step, batch %d x %d blocks", batch, num_blocks)
        state = self._window_state(batch, num_blocks, need_filter, need_raw, mrope)
        meta = state.metadata()
        block_size = self.block_size
        scratch_slot = self.kv_cache.scratch_block * block_size

        def step() -> None:
            decode_step(self.forward, state, meta, block_size, scratch_slot)

        def neutral() -> None:
            self._pad_inputs(0, batch, num_blocks)
            self._pad_sampling(0, batch)
            self._loaded_sampling = None

        return self._record(step, neutral)[0]

    def replay_window(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        sampling: SamplingTensors,
        steps_left: torch.Tensor,
        num_steps: int,
        rope_offsets: torch.Tensor | None = None,
    ) -> DecodeState:
        """Runs a decode window through the step graph of its bucket; returns the state holding the outputs."""
        batch, num_blocks = meta.block_tables.shape
        padded_batch, padded_blocks = self._bucket(batch, num_blocks)
        mrope = rope_offsets is not None
        key = (padded_batch, padded_blocks, sampling.need_filter, sampling.need_raw, mrope)
        if key not in self.window_graphs:
            self.window_graphs[key] = self._capture_window(key)
        self._load_inputs(input_ids, positions, meta, (padded_batch, padded_blocks), rope_offsets)
        self._load_sampling(sampling, steps_left, padded_batch)
        graph = self.window_graphs[key]
        for _ in range(num_steps):
            graph.replay()
        return self._window_state(padded_batch, padded_blocks, sampling.need_filter, sampling.need_raw, mrope)
