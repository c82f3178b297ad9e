"""The rollout object the actor worker composes: `generate_sequences(DataProto) -> DataProto`, `load_weights`,
`sleep`, `wake`, and `await generate(...)` for agent loops.

    rollout = build_rollout(config.actor_rollout_ref.rollout, model_path, tokenizer)
    out = rollout.generate_sequences(prompts)     # prompts: input_ids / attention_mask / position_ids, left-padded
    rollout.load_weights(actor_named_tensors)     # HF names; in place, never through disk
    rollout.sleep(); ...train...; rollout.wake()

`rollout.name=hyflow` runs the engine (an architecture it does not implement falls back to `hf` with a warning);
`rollout.name=hf` runs `transformers.generate`. Image prompts (the batch's `multi_modal_inputs`, one dict of
processor outputs per row) go to the engine with their rows: it runs the vision tower at prefill (Qwen2-VL,
Qwen2.5-VL; other vision-language models fall back to `hf`). Sampling comes from the rollout config (`val_kwargs` when
`meta_info["validate"]`), overridden by `meta_info` `do_sample` / `temperature`. `n` is 1 here: the trainer repeats
prompts itself. On CPU the engine computes in float32 (CPU bf16 matmuls are slow and would drift from the actor).

Partial rollouts (weights that arrive while requests run; the engine's async step loop must be serving them):

    out = await rollout.generate_sequences_async(prompts)   # every row a request of the async engine's step loop
    await rollout.update_weights_in_flight(named_tensors, policy_version=k)   # elsewhere, on the same event loop:
    # pause at the step boundary, load, resume; `out` then holds tokens of both versions (rollout_policy_versions)

With `tensor_model_parallel_size` > 1, consecutive ranks of the worker group form one engine (parallel.py): each
rank's chunk of prompts is gathered within its TP group, the group generates them all, and each rank returns its own
rows. The per-request API (agent loops) needs tensor_model_parallel_size=1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from hyflow import fields as F
from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.models import is_supported, tp_weight_slices
from hyflow.engine.parallel import TensorSlice
from hyflow.engine.sequence import CompletionOutput, RequestOutput
from hyflow.protocol import DataProto
from hyflow.rollout.batch import pack_responses, unpadded_prompts
from hyflow.rollout.hf_rollout import HFRollout
from hyflow.rollout.policy_versions import policy_version_metrics

logger = logging.getLogger(__name__)


def sampling_for_batch(config: Any, meta_info: dict[str, Any]) -> SamplingParams:
    """SamplingParams of one generate_sequences call from the rollout config and the batch's meta_info."""
    source = config.val_kwargs if meta_info.get(F.VALIDATE, False) else config
    do_sample = meta_info.get(F.DO_SAMPLE, source.do_sample)
    temperature = meta_info.get(F.TEMPERATURE, source.temperature) if do_sample else 0.0
    return SamplingParams(
        temperature=temperature,
        top_p=source.top_p if do_sample else 1.0,
        top_k=source.top_k if do_sample else -1,
        max_tokens=config.response_length,
        ignore_eos=config.ignore_eos,
    )


def row_sampling_params(params: SamplingParams, seed: int | None, num_rows: int) -> SamplingParams | list:
    """With a batch seed (`meta_info["seed"]`), one SamplingParams per row whose seed derives from (batch seed,
    rank, row), so a batch samples the same tokens whatever the engine generated before (e.g. after a resume);
    without one, the shared `params` (the engine draws the seeds)."""
    if seed is None:
        return params
    rank = int(os.environ.get("RANK", "0"))
    return [dataclasses.replace(params, seed=hash((int(seed), rank, row)) & 0xFFFFFFFF) for row in range(num_rows)]


def row_images(multi_modal_inputs: Any, num_rows: int) -> list[dict[str, Any] | None] | None:
    """Each row's processor outputs for the engine (None for a row without images), or None for a text batch."""
    if multi_modal_inputs is None:
        return None
    rows = [row or None for row in multi_modal_inputs]
    assert len(rows) == num_rows, "multi_modal_inputs travels with its rows"
    return rows if any(row is not None for row in rows) else None


def vision_markup_ids(hf_config: Any) -> list[int]:
    """A vision-language model's image / video pad and vision start / end token ids."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return [i for i in (getattr(hf_config, name, None) for name in names) if i is not None]


def without_vision_markup(output: CompletionOutput, vision_ids: list[int]) -> CompletionOutput:
    """A response that sampled a vision markup token (a stop token of the engine's VLM requests) ends just before
    it, finish_reason "stop": a pad token in a response would take an image slot in the training forward (the hf
    rollout suppresses these tokens instead)."""
    if not output.token_ids or output.token_ids[-1] not in vision_ids:
        return output
    versions = None if output.policy_versions is None else output.policy_versions[:-1]
    return dataclasses.replace(
        output, token_ids=output.token_ids[:-1], log_probs=output.log_probs[:-1], policy_versions=versions
    )


def engine_dtype(config: Any) -> str:
    """The dtype an engine of `rollout` config `config` holds its weights in: `rollout.dtype` on CUDA, float32 on
    the CPU."""
    return config.dtype if torch.cuda.is_available() else "float32"


def engine_config_from_rollout(config: Any) -> EngineConfig:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    max_model_len = config.max_model_len or config.prompt_length + config.response_length
    return EngineConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=max(config.max_num_batched_tokens, max_model_len),
        max_model_len=max_model_len,
        gpu_memory_utilization=config.gpu_memory_utilization,
        dtype=engine_dtype(config),
        device=device,
        enforce_eager=config.enforce_eager,
        num_scheduler_steps=config.num_scheduler_steps,
        async_scheduling=config.async_scheduling,
        tensor_parallel_size=config.tensor_model_parallel_size,
        partial_rollout_kv=config.partial_rollout_kv,
    )


def hf_weight_names(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Plain HF names from wrapped models: strips peft's `base_model.model.`, `.base_layer`, torch.compile's
    `_orig_mod.` and FSDP1's `_fsdp_wrapped_module.`; unmerged LoRA weights are an error."""
    for name, tensor in weights:
        if "lora_" in name:
            raise ValueError(
                f"weight {name!r} is an unmerged LoRA adapter; merge the adapters into the base "
                "weights (peft merge) before loading them into the rollout"
            )
        yield hf_weight_name(name), tensor


def hf_weight_name(name: str) -> str:
    """One name of `hf_weight_names`."""
    name = name.removeprefix("base_model.model.").replace("_orig_mod.", "").replace("_fsdp_wrapped_module.", "")
    return name.replace(".base_layer.", ".")


class EngineRollout:
    """Rollout on hyflow's engine; `async_engine` serves agent loops on the same engine and KV cache. With
    `record_routing` (routing replay R3) every output carries the engine's routing record: the batch API as the
    `routed_experts` field, the per-request API as `CompletionOutput.routed_experts`."""

    def __init__(self, model: str | nn.Module, config: Any, tokenizer: Any, record_routing: bool = False) -> None:
        self.config = config
        engine_config = dataclasses.replace(engine_config_from_rollout(config), record_routing=record_routing)
        self.engine = LLMEngine(model, engine_config, tokenizer)
        self.record_routing = record_routing
        self.async_engine = AsyncLLMEngine(self.engine)
        pad = tokenizer.pad_token_id if tokenizer is not None else None
        self.pad_token_id = pad if pad is not None else min(self.engine.eos_token_ids, default=0)
        self.vision_token_ids = vision_markup_ids(self.engine.hf_config) if self.engine.vision is not None else []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        prompt_ids, params, images = self._requests(prompts)
        return self._pack(prompts, [out.outputs[0] for out in self._generate(prompt_ids, params, images)])

    async def generate_sequences_async(self, prompts: DataProto) -> DataProto:
        """`generate_sequences` with every row a request of the async engine's shared step loop, so that
        `update_weights_in_flight` (or `pause`) on the same event loop can pause it midway: rows then carry tokens
        of several policy versions. Needs tensor_model_parallel_size=1 (the async API's rule)."""
        prompt_ids, params, images = self._requests(prompts)
        rows = params if isinstance(params, list) else [params] * len(prompt_ids)
        row_inputs = images or [None] * len(prompt_ids)
        requests = (
            self.async_engine.generate(prompt, p, multi_modal_inputs=inputs)
            for prompt, p, inputs in zip(prompt_ids, rows, row_inputs)
        )
        return self._pack(prompts, [out.outputs[0] for out in await asyncio.gather(*requests)])

    def _requests(self, prompts: DataProto) -> tuple[list[list[int]], SamplingParams | list, list | None]:
        """The engine requests of a prompt batch: unpadded prompt ids, their sampling parameters, and each row's
        processor outputs (None for a text batch)."""
        params = self._with_vision_stops(sampling_for_batch(self.config, prompts.meta_info))
        eos = prompts.meta_info.get(F.EOS_TOKEN_ID)
        if eos is not None:
            self.engine.eos_token_ids |= set(eos if isinstance(eos, list) else [eos])
        prompt_ids = unpadded_prompts(prompts.batch[F.INPUT_IDS], prompts.batch[F.ATTENTION_MASK])
        params = row_sampling_params(params, prompts.meta_info.get(F.SEED), len(prompt_ids))
        return prompt_ids, params, row_images(prompts.non_tensor_batch.get(F.MULTI_MODAL_INPUTS), len(prompt_ids))

    def _pack(self, prompts: DataProto, outputs: list[CompletionOutput]) -> DataProto:
        """The engine's outputs in the actor's layout, with the policy versions of the tokens and their metrics
        (lag behind the version the engine holds now)."""
        if self.vision_token_ids:
            outputs = [without_vision_markup(o, self.vision_token_ids) for o in outputs]
        out = pack_responses(
            prompts,
            [o.token_ids for o in outputs],
            [o.log_probs for o in outputs],
            [o.finish_reason for o in outputs],
            self.config.response_length,
            self.pad_token_id,
            [o.policy_versions for o in outputs],
            [o.routed_experts for o in outputs] if self.record_routing else None,
        )
        batch = out.batch
        versions = policy_version_metrics(
            batch[F.ROLLOUT_POLICY_VERSIONS], batch[F.RESPONSE_MASK], self.engine.policy_version
        )
        out.meta_info[F.METRICS] = {**out.meta_info.get(F.METRICS, {}), **versions}
        return out

    def _generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams | list[SamplingParams],
        images: list[dict[str, Any] | None] | None = None,
    ) -> list[RequestOutput]:
        """The engine's outputs for this rank's prompts (`images`: each row's processor outputs, None for a text
        row). With tensor parallelism every rank of the TP group holds its own chunk of the batch (data-parallel
        dispatch): the group gathers all chunks, generates all of them on every rank in lockstep, and each rank
        keeps its own rows."""
        tp = self.engine.tp
        if tp.size == 1:
            return self.engine.generate(prompt_ids, params, multi_modal_inputs=images)
        rows = params if isinstance(params, list) else [params] * len(prompt_ids)
        chunks = tp.all_gather_objects((prompt_ids, rows, images or [None] * len(prompt_ids)))
        all_prompts = [prompt for chunk_prompts, _, _ in chunks for prompt in chunk_prompts]
        all_params = [p for _, chunk_params, _ in chunks for p in chunk_params]
        all_images = [i for _, _, chunk_images in chunks for i in chunk_images]
        start = sum(len(chunk_prompts) for chunk_prompts, _, _ in chunks[: tp.rank])
        outputs = self.engine.generate(all_prompts, all_params, multi_modal_inputs=all_images)
        return outputs[start : start + len(prompt_ids)]

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | dict,
        request_id: str | None = None,
        multi_modal_inputs: dict[str, Any] | None = None,
    ) -> CompletionOutput:
        """One request through the shared async step loop (agent loops call this concurrently; an image prompt
        brings its processor outputs, `multi_modal_inputs`)."""
        if isinstance(params, dict):
            params = SamplingParams.from_dict(params)
        params = self._with_vision_stops(params)
        output = await self.async_engine.generate(prompt_token_ids, params, request_id, multi_modal_inputs)
        completion = output.outputs[0]
        return without_vision_markup(completion, self.vision_token_ids) if self.vision_token_ids else completion

    def _with_vision_stops(self, params: SamplingParams) -> SamplingParams:
        """A VLM's requests stop at vision markup tokens, which `without_vision_markup` then drops."""
        if not self.vision_token_ids:
            return params
        return dataclasses.replace(params, stop_token_ids=[*params.stop_token_ids, *self.vision_token_ids])

    async def abort(self, request_id: str) -> None:
        await self.async_engine.abort(request_id)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int | None = None) -> int:
        """Loads weights while no request runs in the async step loop (else use `update_weights_in_flight`)."""
        return self.engine.load_weights(hf_weight_names(weights), policy_version)

    def tp_weight_slices(self, name: str) -> list[TensorSlice | None] | None:
        """The slice of HF weight `name` that each TP rank of this engine holds (None: every rank holds it whole);
        the weight sync sends each rank only its own (hyflow.workers.weight_sync), and `load_weights` takes them."""
        return tp_weight_slices(self.engine.model.args, hf_weight_name(name))

    async def pause(self) -> None:
        """Pauses the async step loop at the step boundary; requests wait (and may be aborted) until `resume`."""
        await self.async_engine.pause()

    async def resume(self) -> None:
        await self.async_engine.resume()

    async def update_weights_in_flight(
        self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int | None = None
    ) -> int:
        """Pause at the step boundary, load the weights as `policy_version`, resume: the requests in flight keep
        their tokens and go on under the new weights (their KV cache recomputed or kept: `partial_rollout_kv`).
        `weights` is consumed in a worker thread (the event loop keeps serving), so it may be a generator that
        receives buckets (e.g. weight_sync.iter_bucketed_state): the engine stays paused until the last one.

        With no request in flight the weights load at once, without pausing or yielding the event loop: a blocking
        `generate_sequences` call that the worker's event loop serves next must not find the engine paused."""
        if not self.async_engine.has_requests:
            return self.load_weights(weights, policy_version)
        await self.pause()
        try:
            return await self.async_engine.load_weights(hf_weight_names(weights), policy_version)
        finally:
            await self.resume()

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()

    @property
    def cuda_graph_captures(self) -> int:
        """CUDA graphs the engine captured so far (0 on CPU or with enforce_eager)."""
        graphs = self.engine.runner.graphs
        return 0 if graphs is None else graphs.num_captures


def _load_hf_model(source: str | nn.Module, dtype: str) -> nn.Module:
    if isinstance(source, nn.Module):
        return source
    import transformers
    from packaging.version import Version

    from hyflow.models.multimodal import auto_model_class

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, dtype) if device == "cuda" else torch.float32
    # transformers 4.56 renamed `torch_dtype` to `dtype`; older versions would silently ignore `dtype`.
    key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    return auto_model_class(_auto_config(source)).from_pretrained(source, **{key: torch_dtype}).to(device)


def build_rollout(
    config: Any, model: str | nn.Module, tokenizer: Any, record_routing: bool = False
) -> EngineRollout | HFRollout:
    """The rollout for `config` (a RolloutConfig): hyflow's engine, or the transformers fallback. `record_routing`
    (actor.router_replay.mode=R3) needs the engine: ValueError where the fallback would run instead."""
    if config.name not in ("hyflow", "hf"):
        raise ValueError(
            f"actor_rollout_ref.rollout.name={config.name!r} is not available in hyflow; use 'hyflow' "
            "(the built-in engine) or 'hf' (transformers.generate)"
        )
    if config.name == "hyflow":
        hf_config = model.config if isinstance(model, nn.Module) else _auto_config(model)
        if is_supported(hf_config):
            return EngineRollout(model, config, tokenizer, record_routing)
        if record_routing:
            raise ValueError(
                "actor_rollout_ref.actor.router_replay.mode=R3 replays the routing the engine records, but the "
                f"hyflow engine does not implement {getattr(hf_config, 'architectures', None)} and "
                "transformers.generate records none. Fix: set actor_rollout_ref.actor.router_replay.mode=R2 or "
                "disabled."
            )
        logger.warning(
            "rollout: the hyflow engine does not implement %s; falling back to rollout.name=hf "
            "(transformers.generate, slower)",
            getattr(hf_config, "architectures", None),
        )
    return HFRollout(
        _load_hf_model(model, config.dtype),
        tokenizer,
        config.response_length,
        lambda meta: dataclasses.replace(sampling_for_batch(config, meta), seed=meta.get(F.SEED)),
    )


def _auto_config(path: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)
