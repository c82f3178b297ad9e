"""Runs one engine step on the device: flatten the scheduled sequences into model inputs, forward over the paged
KV cache, and sample. On CUDA, decode steps replay CUDA graphs captured for a ladder of batch sizes. A decode window
(`launch_window`, then in_flight.read_outputs) runs several decode steps without a host round trip (multi_step.py).

Inputs of one step (T new tokens from B sequences, see attention.py for the metadata):
    input_ids (T,), positions (T,), AttentionMetadata; logits (B, V) at each sequence's last new token.
"""

from __future__ import annotations

import array
import dataclasses

import torch

from hyflow.engine.attention import AttentionMetadata
from hyflow.engine.config import EngineConfig
from hyflow.engine.cuda_graphs import DecodeGraphs
from hyflow.engine.decode_state import new_decode_state
from hyflow.engine.in_flight import LaunchedBatch, send_columns
from hyflow.engine.kv_cache import KVCache
from hyflow.engine.models.llama import DecoderForCausalLM
from hyflow.engine.models.moe import SparseMoeBlock
from hyflow.engine.models.vision import VisionTower
from hyflow.engine.multi_step import decode_step, send_outputs
from hyflow.engine.routing_cache import RoutingCache
from hyflow.engine.sampler import SamplingTensors, sample, top_alternatives
from hyflow.engine.scheduler import ScheduledBatch
from hyflow.engine.sequence import Sequence
from hyflow.engine.vision_inputs import rope_offsets, rope_positions, step_embeddings

_TYPECODES = {torch.long: "q", torch.float32: "f"}


def _to_device(rows: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a device tensor: pinned memory and a non-blocking copy on CUDA.

    The list goes through `array.array` (a C loop), several times faster than `torch.tensor(list)`.
    """
    if not rows:
        return torch.empty(0, dtype=dtype, device=device)
    tensor = torch.frombuffer(array.array(_TYPECODES[dtype], rows), dtype=dtype)  # keeps the array alive
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def prepare_inputs(
    seqs: list[Sequence], block_size: int, pad_block: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Flattens the uncomputed tokens of each sequence (`token_ids[num_computed_tokens:]`) into one step.

    The host builds flat lists (slices and ranges: no Python loop over tokens) and sends them in one copy; the cache
    slots and the padded (B, Qmax) indices are made on the device:
        slot[t] = block_tables[row[t], pos[t] // block_size] * block_size + pos[t] % block_size
    """
    num_seqs = len(seqs)
    q_lens = [seq.num_tokens - seq.num_computed_tokens for seq in seqs]
    q_max, max_blocks = max(q_lens), max(len(seq.block_table) for seq in seqs)
    if q_max == 1:
        return _prepare_decode(seqs, block_size, pad_block, max_blocks, device)
    input_ids, positions, rows, tables, token_index = [], [], [], [], []
    for b, (seq, q_len) in enumerate(zip(seqs, q_lens)):
        start, table = len(seq) - q_len, seq.block_table
        input_ids += seq.token_ids[start:]
        positions += range(start, len(seq))
        rows += [b] * q_len
        tables += table
        tables += [pad_block] * (max_blocks - len(table))
        token_index += range(b * q_max, b * q_max + q_len)
    num_tokens = len(input_ids)
    flat = _to_device(input_ids + positions + rows + tables + q_lens + token_index, torch.long, device)
    sizes = [num_tokens, num_tokens, num_tokens, num_seqs * max_blocks, num_seqs, len(token_index)]
    ids_t, positions_t, rows_t, tables_t, q_lens_t, token_index_t = flat.split(sizes)
    tables_t = tables_t.view(num_seqs, max_blocks)
    slots_t = tables_t[rows_t, positions_t // block_size] * block_size + positions_t % block_size
    ends = q_lens_t.cumsum(0)
    offsets = torch.arange(q_max, device=device)[None, :]
    query_index = (ends - q_lens_t)[:, None] + torch.minimum(offsets, (q_lens_t - 1)[:, None])
    query_positions = torch.where(offsets < q_lens_t[:, None], positions_t[query_index], 0)
    meta = AttentionMetadata(
        slot_mapping=slots_t,
        block_tables=tables_t,
        query_index=query_index,
        query_positions=query_positions,
        token_index=token_index_t,
        logits_index=ends - 1,
        from_zero=all(seq.num_computed_tokens == 0 for seq in seqs),
    )
    return ids_t, positions_t, meta


def _prepare_decode(
    seqs: list[Sequence],
    block_size: int,
    pad_block: int,
    max_blocks: int,
    device: torch.device,
    pending: list[int] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, AttentionMetadata]:
    """`prepare_inputs` when every sequence brings exactly one new token (its last sampled one). With `pending`
    (a window queued behind another), sequence i's token is `pending[i]` positions further on and not on the host
    yet: the input ids are None (the caller has them on the device). The host sends the ids, positions and padded
    block tables in one copy; the cache slots are made on the device, with no per-row arithmetic on the host:
        slot[b] = block_tables[b, pos[b] // block_size] * block_size + pos[b] % block_size
    """
    num_seqs = len(seqs)
    if pending is None:
        input_ids = [seq.token_ids[-1] for seq in seqs]
        positions = [seq.num_tokens - 1 for seq in seqs]
    else:
        input_ids, positions = [], [seq.num_tokens - 1 + ahead for seq, ahead in zip(seqs, pending)]
    tables, padding = [], [pad_block] * max_blocks
    for seq in seqs:
        table = seq.block_table
        tables += table
        if len(table) < max_blocks:
            tables += padding[len(table) :]
    flat = _to_device(input_ids + positions + tables, torch.long, device)
    ids_t = flat[:num_seqs] if pending is None else None
    positions_t = flat[len(input_ids) : len(input_ids) + num_seqs]
    tables_t = flat[len(input_ids) + num_seqs :].view(num_seqs, max_blocks)
    rows = torch.arange(num_seqs, device=device)
    meta = AttentionMetadata(
        slot_mapping=tables_t[rows, positions_t // block_size] * block_size + positions_t % block_size,
        block_tables=tables_t,
        query_index=rows[:, None],
        query_positions=positions_t[:, None],
        token_index=rows,
        logits_index=rows,
    )
    return ids_t, positions_t, meta


def _output_indices(seqs: list[Sequence], pending: list[int] | None) -> list[int]:
    """Per sequence, the output index of the token the next step samples (the sampler's counter)."""
    if pending is None:
        return [seq.num_output_tokens for seq in seqs]
    return [seq.num_output_tokens + ahead for seq, ahead in zip(seqs, pending)]


def prepare_sampling(seqs: list[Sequence], device: torch.device, pending: list[int] | None = None) -> SamplingTensors:
    """Per-row sampling settings, sent in two copies (one float, one integer)."""
    params = [seq.params for seq in seqs]
    floats = _to_device([p.temperature for p in params] + [p.top_p for p in params], torch.float32, device)
    ints = [p.top_k for p in params] + [seq.seed for seq in seqs] + _output_indices(seqs, pending)
    top_k, seeds, counters = _to_device(ints, torch.long, device).view(3, len(seqs))
    temperatures, top_p = floats.view(2, len(seqs))
    return SamplingTensors(
        temperatures=temperatures,
        top_k=top_k,
        top_p=top_p,
        seeds=seeds,
        counters=counters,
        need_filter=any(p.top_k > 0 or p.top_p < 1 for p in params),
        need_raw=any(p.raw_log_probs for p in params),
        num_top=max(p.top_log_probs for p in params),
    )


def attach_routing_cache(model: DecoderForCausalLM, num_blocks: int, config: EngineConfig) -> RoutingCache | None:
    """A routing cache for the model's MoE layers (None for a dense model), each `SparseMoeBlock` given its layer
    to write; made before any CUDA graph is captured, so the graphs record the writes too."""
    blocks = [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, SparseMoeBlock)]
    if not blocks:
        return None
    moe = model.args.moe
    num_slots = (num_blocks + 1) * config.block_size  # the KV cache's blocks and its scratch block
    device = next(model.parameters()).device
    cache = RoutingCache(num_slots, len(blocks), moe.top_k, moe.num_experts, config.block_size, device)
    for index, block in enumerate(blocks):
        block.routing_record = cache.layer(index)
    return cache


class ModelRunner:
    def __init__(
        self,
        model: DecoderForCausalLM,
        config: EngineConfig,
        num_blocks: int,
        device: torch.device,
        dtype: torch.dtype,
        vision: VisionTower | None = None,
    ) -> None:
        self.model, self.config, self.device = model, config, device
        self.vision = vision  # a VLM's vision tower: image prefills (vision_inputs.py)
        self.block_size = config.block_size
        self.kv_cache = KVCache(model.args, num_blocks, config.block_size, dtype, device)
        self.routing = attach_routing_cache(model, num_blocks, config) if config.record_routing else None
        use_graphs = device.type == "cuda" and not config.enforce_eager
        self.graphs = DecodeGraphs(self.forward, self.kv_cache, config, device) if use_graphs else None
        self._window_sampling: tuple[tuple[int, ...], SamplingTensors] | None = None  # (sequence ids, settings)
        self._cache_address: int | None = None  # where the KV cache was before `sleep`

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Eager forward: logits (B, V) at `meta.logits_index` (`positions`: the rotary's, see vision_inputs.py;
        `input_embeds`: an image prefill's token embeddings)."""
        hidden = self.model(input_ids, positions, meta, self.kv_cache.layers, self.block_size, input_embeds)
        return self.model.compute_logits(hidden[meta.logits_index])

    def read_routing(self, seq: Sequence) -> torch.Tensor | None:
        """The routing record (num_computed_tokens, num_moe_layers, k) of a sequence whose blocks it still holds;
        None without a routing cache."""
        if self.routing is None:
            return None
        return self.routing.read(seq.block_table, seq.num_computed_tokens)

    def require_awake(self) -> None:
        """RuntimeError unless the KV cache is there (the engine checks before it schedules anything)."""
        if not self.kv_cache.allocated:
            raise RuntimeError(
                "the engine is asleep (its KV cache was freed by sleep() or close()), so it cannot generate. "
                "Fix: call engine.wake() first (the hybrid worker does this in rollout_mode())."
            )

    def launch(self, batch: ScheduledBatch, after: LaunchedBatch | None = None) -> LaunchedBatch:
        """Queues a scheduled batch: a decode window (`launch_window`, behind `after` if given) or one step."""
        if batch.is_window:
            return self.launch_window(batch, after)
        return self.launch_step(batch)

    @torch.inference_mode()
    def launch_step(self, batch: ScheduledBatch) -> LaunchedBatch:
        """Queues one forward + sample of the scheduled sequences (a prefill, or a decode step) and the copy of
        the sampled tokens to the host, without waiting; in_flight.read_outputs returns them (one column)."""
        self.require_awake()
        if self.device.type != "cuda":
            return self._launch_step(batch)
        with torch.cuda.device(self.device):  # the async engine steps in worker threads, whose current device is 0
            return self._launch_step(batch)

    def _launch_step(self, batch: ScheduledBatch) -> LaunchedBatch:
        seqs = batch.seqs
        input_ids, positions, meta = prepare_inputs(seqs, self.block_size, self.kv_cache.scratch_block, self.device)
        is_decode = all(seq.num_tokens - seq.num_computed_tokens == 1 for seq in seqs)
        if self.graphs is not None and is_decode and self.graphs.fits(len(seqs), meta):
            logits = self.graphs.replay(input_ids, positions, meta, rope_offsets(seqs, self.device))
        else:
            embeds = None if is_decode else step_embeddings(seqs, input_ids, self.model.model.embed_tokens, self.vision)
            logits = self.forward(input_ids, rope_positions(seqs, positions), meta, embeds)
        sampling = prepare_sampling(seqs, self.device)
        tokens, log_probs, raw = sample(logits, sampling)
        column = (None if t is None else t.unsqueeze(1) for t in (tokens, log_probs.float(), raw))
        top = None
        if sampling.num_top:
            top = tuple(t.unsqueeze(1) for t in top_alternatives(logits, sampling))
        return send_columns(batch, *column, top)

    @torch.inference_mode()
    def launch_window(self, batch: ScheduledBatch, after: LaunchedBatch | None = None) -> LaunchedBatch:
        """Queues a decode window of `batch.num_steps` steps (sequence i taking part in the first
        `batch.step_counts[i]`) and the copy of its outputs to the host, without waiting for either;
        in_flight.read_outputs returns the outputs. With `after` (the window before, still on the device), each
        sequence starts from its last token there and `batch.pending[i]` positions further on."""
        self.require_awake()
        if self.device.type != "cuda":
            return self._launch_window(batch, after)
        with torch.cuda.device(self.device):
            return self._launch_window(batch, after)

    def _launch_window(self, batch: ScheduledBatch, after: LaunchedBatch | None) -> LaunchedBatch:
        seqs, num_steps, scratch = batch.seqs, batch.num_steps, self.kv_cache.scratch_block
        if after is None:
            input_ids, positions, meta = prepare_inputs(seqs, self.block_size, scratch, self.device)
            assert meta.query_index.shape[1] == 1, "a decode window needs one new token per sequence"
        else:  # behind `after`: its last tokens (on the device) are the inputs, `pending` positions further on
            max_blocks = max(len(seq.block_table) for seq in seqs)
            _, positions, meta = _prepare_decode(seqs, self.block_size, scratch, max_blocks, self.device, batch.pending)
            input_ids = self._rows_of(after, seqs)
        sampling = self._sampling_for_window(seqs, batch.pending)
        steps_left = _to_device([count - 1 for count in batch.step_counts], torch.long, self.device)
        # The window graphs record no top alternatives: a window that asks for them runs eagerly.
        offsets = rope_offsets(seqs, self.device)  # image sequences' decode shift (mrope.py); None for text
        if self.graphs is not None and not sampling.num_top and self.graphs.fits_window(len(seqs), meta, num_steps):
            state = self.graphs.replay_window(input_ids, positions, meta, sampling, steps_left, num_steps, offsets)
        else:
            state = new_decode_state(input_ids, positions, meta, sampling, steps_left, num_steps, offsets)
            step_meta = state.metadata()
            for _ in range(num_steps):
                decode_step(self.forward, state, step_meta, self.block_size, scratch * self.block_size)
        return send_outputs(state, batch)

    def _rows_of(self, after: LaunchedBatch, seqs: list[Sequence]) -> torch.Tensor:
        """`after`'s last tokens (B,) of `seqs`, which are `after`'s rows in order, some maybe left out; a copy,
        which the window advances in place."""
        if len(seqs) == len(after.batch.seqs):  # none left out: the same rows
            return after.last_tokens.clone()
        row_of = {seq.seq_id: row for row, seq in enumerate(after.batch.seqs)}
        return after.last_tokens[_to_device([row_of[seq.seq_id] for seq in seqs], torch.long, self.device)]

    def _sampling_for_window(self, seqs: list[Sequence], pending: list[int] | None) -> SamplingTensors:
        """A window's sampling settings. The per-row constants (temperature, top-k, top-p, seed) are built and sent
        again only when the batch changed since the last window; the counters (output indices) every window."""
        key = tuple(seq.seq_id for seq in seqs)
        if self._window_sampling is None or self._window_sampling[0] != key:
            self._window_sampling = (key, prepare_sampling(seqs, self.device, pending))
            return self._window_sampling[1]
        counters = _to_device(_output_indices(seqs, pending), torch.long, self.device)
        return dataclasses.replace(self._window_sampling[1], counters=counters)

    def sleep(self) -> None:
        """Frees the KV cache; the CUDA graphs (and their memory pool) are kept for `wake`."""
        if self.kv_cache.allocated:  # asleep already: the address of the last cache stays the one to compare
            self._cache_address = self.kv_cache.data.data_ptr()
        self.kv_cache.free()

    def wake(self) -> None:
        """Allocates the KV cache again. The graphs hold its address: they are replayed as they are when the cache
        comes back at the same address (usual when nothing else took its place) and captured anew otherwise.
        Awake already (`rollout.free_cache_engine=False`): nothing to do."""
        if self.kv_cache.allocated:
            return
        self.kv_cache.allocate()
        if self.graphs is not None and self.kv_cache.data.data_ptr() != self._cache_address:
            self.graphs.clear()
