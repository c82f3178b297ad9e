"""LLMEngine: the generation engine's batch API and step loop.

    engine = LLMEngine("path/to/hf_folder")                       # or an in-memory transformers model
    outputs = engine.generate([[1, 5, 9], [1, 7]], SamplingParams(temperature=0, max_tokens=32))
    outputs[0].outputs[0].token_ids, outputs[0].outputs[0].log_probs, outputs[0].outputs[0].finish_reason

Each `step()` asks the scheduler for the next batch, runs it (model_runner.py), appends the sampled tokens, ends the
sequences that hit a stop condition, and returns the requests that finished. A decode `step()` is a window of up to
`EngineConfig.num_scheduler_steps` forward steps with one host sync (multi_step.py); requests added or aborted
meanwhile join or leave at the next `step()`. With `EngineConfig.async_scheduling` the next window is queued on the
device before the current one's tokens are read, so the host's work between windows overlaps the device's
(in_flight.py owns that hand-off). Bad
requests raise `ValueError` in `add_request` before anything is queued, so the engine keeps serving the others.

Tensor parallelism (`EngineConfig.tensor_parallel_size`, parallel.py): each process of a TP group builds the engine
with its shard of the model (`tp_group`, or groups of consecutive ranks of the torch.distributed world) and calls
`generate` with the same prompts and sampling parameters. The logits, hence the tokens, are identical on every rank,
so the schedulers agree step by step (SPMD) and every rank returns the same outputs.

Partial rollouts (weights that change while requests run): `pause()` stops at the step boundary (the requests keep
their tokens; nothing runs until `resume()`, requests added meanwhile wait), `load_weights(weights,
policy_version=k)` loads new weights in place, `resume()` goes on. Every output token records the `policy_version`
whose weights sampled it (`CompletionOutput.policy_versions`); `EngineConfig.partial_rollout_kv` says whether the
running sequences' KV cache is recomputed under the new weights (default) or kept.
"""

from __future__ import annotations

import gc
import logging
import random
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from hyflow.engine.block_manager import BlockManager
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.in_flight import HostOutputs, InFlight, read_outputs
from hyflow.engine.kv_cache import num_blocks_for_memory
from hyflow.engine.model_runner import ModelRunner
from hyflow.engine.models import load_model, load_vision
from hyflow.engine.models.vision import load_weights
from hyflow.engine.multimodal import PromptImages, VisionSpec, prompt_images
from hyflow.engine.parallel import TensorParallel
from hyflow.engine.request_checks import check_request
from hyflow.engine.scheduler import ScheduledBatch, Scheduler
from hyflow.engine.sequence import CompletionOutput, FinishReason, RequestOutput, Sequence, SequenceStatus
from hyflow.engine.stopping import eos_token_ids, finish_reason, stop_token_ids

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LLMEngine:
    def __init__(
        self, model: str | nn.Module, config: EngineConfig | None = None, tokenizer: Any = None, tp_group: Any = None
    ) -> None:
        """`tp_group`: the torch.distributed group of this rank's TP peers (with `tensor_parallel_size` > 1; None:
        groups of consecutive ranks of the world, made here, a collective call over the world)."""
        self.config = config = config or EngineConfig()
        self.tp = TensorParallel.build(config.tensor_parallel_size, tp_group)
        device = "cuda" if config.device == "auto" and torch.cuda.is_available() else config.device
        self.device = torch.device("cpu" if device == "auto" else device)
        if config.dtype == "auto":
            self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        else:
            self.dtype = DTYPES[config.dtype]
        self.hf_config = model.config if isinstance(model, nn.Module) else None
        if self.hf_config is None:
            from transformers import AutoConfig

            self.hf_config = AutoConfig.from_pretrained(model)
        max_model_len = config.check_model_len(self.hf_config.get_text_config().max_position_embeddings)
        self.model = load_model(model, max_model_len, self.dtype, self.device, self.tp)
        self.vision = load_vision(model, self.dtype, self.device)  # a VLM's vision tower, run at prefill
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids(model, self.hf_config, tokenizer)
        # The ranks of a TP group must schedule alike, so they all take the smallest cache any of them can hold.
        num_blocks = self.tp.min(num_blocks_for_memory(self.model.args, config, self.dtype, self.device), self.device)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.runner = ModelRunner(self.model, config, num_blocks, self.device, self.dtype, self.vision)
        self.requests: dict[str, tuple[list[int], list[Sequence]]] = {}
        self._seed_source = random.Random(config.seed)
        self.last_step_was_prefill = False  # for step-time metrics
        self.last_num_steps = 1  # forward steps the last `step()` ran (a decode window runs several)
        self.in_flight = InFlight(self.scheduler, self.runner.launch, config.async_scheduling)
        self._next_id = 0
        # The weights' version, recorded with every token sampled. Every batch a `step()` reads was launched after
        # the last `load_weights` (which drops anything queued before it), so its tokens come from these weights.
        self.policy_version = 0
        self.paused = False  # pause() ... resume(): `step()` runs nothing

    # ---- requests -------------------------------------------------------------------------------------------
    def _prompt_images(self, request_id: str, prompt: list[int], inputs: dict[str, Any] | None) -> PromptImages | None:
        """The request's images (multimodal.py), None for a text prompt; ValueError when the model has no vision
        tower or the inputs do not match the prompt."""
        if not inputs:
            return None
        if self.vision is None:
            raise ValueError(
                f"request {request_id!r} carries images or videos (multi_modal_inputs), but the engine's model "
                f"{getattr(self.hf_config, 'architectures', None)} has no vision tower; load a vision-language model"
            )
        return prompt_images(prompt, inputs, VisionSpec.from_hf_config(self.hf_config), request_id)

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | dict | None = None,
        request_id: str | None = None,
        multi_modal_inputs: dict[str, Any] | None = None,
    ) -> str:
        """Queues one request (its `n` samples share the prompt's cache blocks); returns its id.
        `multi_modal_inputs`: the processor's `pixel_values` and `image_grid_thw` of an image prompt (for videos
        `pixel_values_videos`, `video_grid_thw` and, Qwen2.5-VL, `second_per_grid_ts`), whose `prompt_token_ids`
        hold each image's (video's) pad tokens expanded (as the processor returns them)."""
        if params is None:
            params = SamplingParams()
        elif isinstance(params, dict):
            params = SamplingParams.from_dict(params)
        if request_id is None:
            request_id, self._next_id = str(self._next_id), self._next_id + 1
        prompt = [int(t) for t in prompt_token_ids]
        check_request(
            request_id, prompt, params, running=self.requests, max_model_len=self.config.max_model_len,
            vocab_size=self.model.args.vocab_size, block_size=self.config.block_size,
            num_blocks=self.block_manager.num_blocks, has_tokenizer=self.tokenizer is not None,
        )  # fmt: skip
        images = self._prompt_images(request_id, prompt, multi_modal_inputs)
        base_seed = params.seed if params.seed is not None else self._seed_source.getrandbits(32)
        seeds = [hash((base_seed, i)) & 0xFFFFFFFF for i in range(params.n)]
        seqs = [Sequence(request_id, prompt, params, seed, i, images) for i, seed in enumerate(seeds)]
        stop_ids = stop_token_ids(params, self.eos_token_ids)  # fixed for the request's life
        for seq in seqs:
            seq.stop_token_ids = stop_ids
            self.scheduler.add(seq)
        self.requests[request_id] = (prompt, seqs)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stops a request now; returns its partial output (finish_reason "abort"), or None if unknown."""
        if request_id not in self.requests:
            return None
        for seq in self.requests[request_id][1]:
            if seq.status != SequenceStatus.FINISHED:
                self._finish(seq, "abort")
        return self._pop_output(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step loop --------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Runs one forward step, or a decode window of several (multi_step.py); returns the requests that finished.

        After a window each sequence takes its tokens one by one through the stop checks, exactly as after single
        steps; the tokens after a stop are dropped. With async scheduling the next window (or the next prefill) is
        queued on the device before this one's tokens are read (scheduler.py); it is what the next call reads.
        """
        if self.paused:
            return []
        self.runner.require_awake()  # before scheduling: a failed step must leave the queue as it was
        launched = self.in_flight.take()
        if launched is None:
            self.last_step_was_prefill, self.last_num_steps = False, 1
            return []
        batch = launched.batch
        self.last_step_was_prefill, self.last_num_steps = batch.is_prefill, batch.num_steps
        self.in_flight.queue_behind(launched)
        return self._take_outputs(batch, read_outputs(launched))

    def _take_outputs(self, batch: ScheduledBatch, outputs: HostOutputs) -> list[RequestOutput]:
        """Appends a step's or window's tokens to its running sequences (skipping those that ended meanwhile);
        returns the requests that finished. It runs once per row and window (at 1024 rows the host's largest
        cost), so a row without stop strings or top alternatives takes its tokens in one bulk append."""
        tokens, log_probs, raw, top = outputs
        counts = batch.step_counts if batch.is_window else None
        block_size, finished = self.block_manager.block_size, []
        for i, seq in enumerate(batch.seqs):
            if seq.status is not SequenceStatus.RUNNING:  # stopped in the window before, or aborted
                continue
            start, row = seq.num_computed_tokens, tokens[i]
            if counts is not None and counts[i] < len(row):
                row = row[: counts[i]]
            row_raw = raw[i] if raw is not None and seq.params.raw_log_probs else None
            if seq.params.stop or (top is not None and seq.params.top_log_probs):
                row_top = None if top is None else self._row_top(seq, top[0][i], top[1][i], len(row))
                reason = self._append_tokens(seq, row, log_probs[i], row_raw, row_top)
            else:
                reason = self._append_token_run(seq, row, log_probs[i], row_raw, None)
            if counts is not None and seq.num_computed_tokens // block_size > start // block_size:
                self.block_manager.register_filled_blocks(seq, start)
            if reason is None:
                continue
            self._finish(seq, reason)
            if all(s.status is SequenceStatus.FINISHED for s in self.requests[seq.request_id][1]):
                finished.append(self._pop_output(seq.request_id))
        return finished

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Ends a sequence, first reading its routing record while it holds its blocks (`record_routing`)."""
        if seq.status is SequenceStatus.RUNNING:
            seq.routed_experts = self.runner.read_routing(seq)
        self.scheduler.finish(seq, reason)

    @staticmethod
    def _row_top(seq: Sequence, ids: list, lps: list, count: int) -> list[dict[int, float]] | None:
        """A row's top alternatives per token, cut to the row's own k (None when it asked for none)."""
        k = seq.params.top_log_probs
        return [dict(zip(i[:k], lp[:k])) for i, lp in zip(ids[:count], lps[:count])] if k else None

    def _append_tokens(
        self,
        seq: Sequence,
        tokens: list[int],
        log_probs: list[float],
        raw: list[float] | None,
        top: list[dict[int, float]] | None = None,
    ) -> FinishReason | None:
        """Appends sampled tokens in order until one ends the sequence; returns why it ended, or None (`raw`: only
        where the sequence keeps raw log-probs)."""
        if not seq.params.stop:  # no stop strings: every check is on token ids and counts, so take them at once
            return self._append_token_run(seq, tokens, log_probs, raw, top)
        for k, token in enumerate(tokens):
            seq.num_computed_tokens = seq.num_tokens  # every token before the new one has its K/V cached
            top_k = None if top is None else top[k]
            raw_k = None if raw is None else raw[k]
            seq.append(token, log_probs[k], raw_k, top_k, policy_version=self.policy_version)
            reason = finish_reason(seq, self.eos_token_ids, self.config.max_model_len, self.tokenizer)
            if reason is not None:
                return reason
        return None

    def _append_token_run(
        self,
        seq: Sequence,
        tokens: list[int],
        log_probs: list[float],
        raw: list[float] | None,
        top: list[dict[int, float]] | None,
    ) -> FinishReason | None:
        """`_append_tokens` without stop strings, in bulk: the tokens up to the first stop id or the length limit
        (at least one), with the reason the per-token checks would give ("stop" before "length" on one token).
        `log_probs` and `raw` may run past `tokens` (a window's full row): only the taken ones are appended."""
        budget = max(1, min(seq.params.max_tokens - seq.num_output_tokens, self.config.max_model_len - seq.num_tokens))
        take = len(tokens) if len(tokens) < budget else budget
        stop_ids, stop_at = seq.stop_token_ids, None
        if stop_ids and not stop_ids.isdisjoint(tokens):  # a C-level test per row; the scan only on a hit
            stop_at = next((k for k, token in enumerate(tokens[:take]) if token in stop_ids), None)
            if stop_at is not None:
                take = stop_at + 1
        if take < len(tokens):
            tokens = tokens[:take]
        if take < len(log_probs):
            log_probs = log_probs[:take]
        seq.extend(
            tokens,
            log_probs,
            None if raw is None else raw[:take],
            None if top is None else top[:take],
            policy_version=self.policy_version,
        )
        seq.num_computed_tokens = seq.num_tokens - 1  # every token before the newest has its K/V cached
        if stop_at is not None:
            return "stop"
        return "length" if take == budget else None

    def _pop_output(self, request_id: str) -> RequestOutput:
        prompt, seqs = self.requests.pop(request_id)
        return RequestOutput(request_id, prompt, [self._sample_output(seq, decode=True) for seq in seqs])

    def snapshot(self, request_id: str) -> RequestOutput | None:
        """A running request's output so far (no text; finish_reason None for the samples still running), or None
        if it is not running. Streaming reads it after every step."""
        if request_id not in self.requests:
            return None
        prompt, seqs = self.requests[request_id]
        return RequestOutput(request_id, prompt, [self._sample_output(seq, decode=False) for seq in seqs])

    def _sample_output(self, seq: Sequence, decode: bool) -> CompletionOutput:
        text = None
        if decode and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
        raw = list(seq.raw_log_probs) if seq.params.raw_log_probs else None
        top = list(seq.top_log_probs) if seq.params.top_log_probs else None
        return CompletionOutput(
            seq.sample_index,
            seq.output_token_ids,
            list(seq.log_probs),
            seq.finish_reason,
            raw,
            text,
            top,
            list(seq.policy_versions),
            seq.routed_experts,
        )

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        progress: bool = False,
        multi_modal_inputs: list[dict[str, Any] | None] | None = None,
    ) -> list[RequestOutput]:
        """Batch API: generates for every prompt and returns the outputs in prompt order (`progress`: a tqdm bar
        of finished prompts on stderr, for long offline runs; `multi_modal_inputs`: one per prompt, None for a
        text prompt, see `add_request`)."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts; give one or one each")
        images = multi_modal_inputs if multi_modal_inputs is not None else [None] * len(prompts)
        if len(images) != len(prompts):
            raise ValueError(f"got {len(images)} multi_modal_inputs for {len(prompts)} prompts; give one per prompt")
        self.runner.require_awake()  # before queueing: an asleep engine keeps no request of this batch
        if self.paused:
            raise RuntimeError(
                "the engine is paused (pause() stops the step loop for a weight load), so generate() would wait "
                "forever. Fix: call engine.resume() first."
            )
        ids: list[str] = []
        try:
            for prompt, p, image_inputs in zip(prompts, params_list, images):
                ids.append(self.add_request(prompt, p, multi_modal_inputs=image_inputs))
        except ValueError:  # one bad prompt: queue none of the batch
            for request_id in ids:
                self.abort(request_id)
            raise
        results: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generating", unit="prompt", disable=not progress) as bar:
            while len(results) < len(ids):
                for output in self.step():
                    results[output.request_id] = output
                    bar.update(1)
        return [results[i] for i in ids]

    # ---- training integration -------------------------------------------------------------------------------
    def pause(self) -> None:
        """Stops generating at the step boundary, for a weight load while requests run (a partial rollout): the
        running requests keep the tokens they have; a batch queued ahead on the device is dropped once the device
        is done with it (after `resume()` its tokens are sampled anew, by the weights then loaded); `step()` runs
        nothing until `resume()`. Requests can still be added (they wait) and aborted (partial output)."""
        self.in_flight.drop()
        self.paused = True

    def resume(self) -> None:
        """Lets `step()` run again after `pause()`."""
        self.paused = False

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int | None = None) -> int:
        """Copies HF-named tensors into the model (a VLM's vision tower included) in place and sets `policy_version`
        (default: one more), which every token sampled from now on records. Pass the version when the weights come
        in several calls (one bucket each). Call it between steps or while paused; a batch queued ahead is dropped
        (it computes with the old weights).

        Cached prefixes are forgotten (old weights). The running sequences go on under the new weights:
        `partial_rollout_kv="recompute"` moves them back to the queue, to re-prefill prompt + tokens so far;
        `"keep"` leaves their KV cache as it is (stale), and only marks its blocks unshareable."""
        if policy_version is not None and policy_version < self.policy_version:
            raise ValueError(
                f"load_weights(policy_version={policy_version}) would go back from the engine's policy_version "
                f"{self.policy_version}; versions only grow (pass the trainer's step of the weights, or None for +1)"
            )
        self.in_flight.drop()  # it computes with the old weights
        count = load_weights(self.model, self.vision, weights)
        self.policy_version = self.policy_version + 1 if policy_version is None else policy_version
        if self.config.partial_rollout_kv == "keep":
            self.block_manager.forget_prefixes(list(self.scheduler.running))
        else:
            self.scheduler.preempt_all()
            self.block_manager.reset()
        return count

    def sleep(self) -> None:
        """Frees the KV cache (for training); running requests are recomputed after `wake()`."""
        self.in_flight.drop()
        self.scheduler.preempt_all()
        self.block_manager.reset()
        self.runner.sleep()

    def wake(self) -> None:
        self.runner.wake()

    def close(self) -> None:
        """Frees the KV cache and drops the CUDA graphs. Under tensor parallelism call it before
        `torch.distributed.destroy_process_group()`: while a graph that captured NCCL collectives is alive, the
        communicator's destruction hangs (pytorch/pytorch#115388)."""
        self.sleep()
        if self.runner.graphs is not None:
            self.runner.graphs.clear()
        gc.collect()  # the graphs' Python objects, so that their CUDA graphs are destroyed now
