"""AgentLoopManager: runs one agent loop per sample, concurrently, and packs the trajectories into a DataProto.

    manager = AgentLoopManager(config.actor_rollout_ref.rollout, tokenizer, servers=[LocalEngineServer(engine)])
    gen_batch = manager.generate_sequences(batch)      # batch: raw_prompt (+ agent_name, tools_kwargs, extra_info)
    manager.start_background_loop()                    # asynchronous training: one event loop for every caller
    future = manager.submit(manager.agenerate_sequences(group))   # a concurrent.futures.Future, from any thread
    manager.stop_background_loop()

Each sample runs the loop named by its `agent_name` (`rollout.agent.default_agent_loop` when the batch has none) as
an asyncio task; all turns of one sample go to one server (`ServerRouter`). Tools and interactions are loaded from
`rollout.multi_turn.tool_config_path` / `interaction_config_path` once, here, so a bad config fails at start-up.
`chat_template_kwargs` (the trainer passes `data.apply_chat_template_kwargs`, e.g. `{enable_thinking: false}`) go
to the chat template with every prompt and message delta, so the loops' prompts are the dataset's.

Output (B samples, P = rollout.prompt_length, R = rollout.response_length): `prompts` (B, P) left-padded,
`responses`, `response_mask`, `rollout_log_probs`, `rollout_policy_versions` (B, R) right-padded (versions: -1 on
tool / user tokens and padding), `input_ids`, `attention_mask`, `position_ids` (B, P + R); non-tensor `num_turns`,
`finish_reason`, `rollout_policy_version_min` / `_max`, and the reward extras `turn_scores`, `tool_rewards`,
`tool_scores`, `agent_reward`; `meta_info["metrics"]` (batch means of the loops' counters) and `["timing"]`.

With a vision-language model's `processor`, the loops fill the prompts' images in (the rows' `multi_modal_data`),
the output adds each trajectory's `multi_modal_inputs` (the prompt's images and those its tools returned, which
replace the prompt-only ones in the training batch) and `position_ids` are the M-RoPE rows (B, 3, P + R) of the
whole sequence.

By default every `generate_sequences` call runs its loops on an event loop of its own (`asyncio.run`). With
`start_background_loop()` they all run on one event loop in a thread of the manager's, so several threads can share
the loops, the router and the tools safely: the asynchronous trainer's producer `submit`s one coroutine per prompt
group (hyflow.trainer.agent_groups) while the trainer's own thread validates with `generate_sequences`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Coroutine, Sequence
from typing import Any

import numpy as np
import torch

from hyflow import fields as F
from hyflow.agent import single_turn, tool_agent  # noqa: F401  (registers the built-in loops)
from hyflow.agent.chat import MessageDelta
from hyflow.agent.interactions.registry import initialize_interactions_from_config
from hyflow.agent.loop import (
    AgentLoopBase,
    AgentLoopContext,
    AgentLoopOutput,
    get_agent_loop_class,
    register_agent_loop,
)
from hyflow.agent.parsers import ToolParser
from hyflow.agent.server import AsyncLLMServer, ServerRouter
from hyflow.agent.tools.registry import import_class, load_all_tools, read_yaml_list
from hyflow.config.actor_rollout_ref import RolloutConfig
from hyflow.data.multimodal import row_position_ids
from hyflow.engine.config import SamplingParams
from hyflow.protocol import DataProto
from hyflow.rollout.batch import routing_rows
from hyflow.rollout.policy_versions import version_range
from hyflow.rollout.worker_rollout import row_sampling_params, sampling_for_batch

logger = logging.getLogger(__name__)

# Per-sample reward extras the loops return (not yet in hyflow/fields.py).
EXTRA_FIELDS = (F.TURN_SCORES, F.TOOL_REWARDS, F.TOOL_SCORES, F.AGENT_REWARD)


def register_loops_from_config(path: str) -> None:
    """Register the agent loops listed in a YAML file: `- {name: my_agent, _target_: pkg.module.MyLoop}`."""
    key = "actor_rollout_ref.rollout.agent.agent_loop_config_path"
    for i, entry in enumerate(read_yaml_list(path, "agent_loops", key)):
        target = entry.get("_target_") or entry.get("class_name")
        if "name" not in entry or target is None:
            raise ValueError(f"{key}={path!r}: agent_loops[{i}] needs 'name' and '_target_' (an import path).")
        cls = import_class(str(target), AgentLoopBase, f"{key}: agent_loops[{i}]", {})
        register_agent_loop(str(entry["name"]))(cls)


class AgentLoopManager:
    """Generates a batch of trajectories with agent loops over one or more async generation servers."""

    def __init__(
        self,
        config: RolloutConfig,
        tokenizer: Any,
        servers: Sequence[AsyncLLMServer],
        processor: Any = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        lengths = (("prompt_length", "data.max_prompt_length"), ("response_length", "data.max_response_length"))
        for key, source in lengths:
            value = getattr(config, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"actor_rollout_ref.rollout.{key}={value!r} must be a positive int; set it (or {source})."
                )
        self.config = config
        self.tokenizer = tokenizer
        self.processor = processor
        multi_turn = config.multi_turn
        tools = load_all_tools(multi_turn.tool_config_path, multi_turn.function_tool_path)
        interactions = (
            initialize_interactions_from_config(multi_turn.interaction_config_path)
            if multi_turn.interaction_config_path
            else {}
        )
        if config.agent.agent_loop_config_path:
            register_loops_from_config(config.agent.agent_loop_config_path)
        get_agent_loop_class(config.agent.default_agent_loop)  # fail now on a bad default name
        self.router = ServerRouter(servers)
        self.context = AgentLoopContext(
            server=self.router,
            tokenizer=tokenizer,
            response_length=config.response_length,
            multi_turn=multi_turn,
            tool_parser=ToolParser.get(multi_turn.format, tokenizer),
            message_delta=MessageDelta(tokenizer, chat_template_kwargs),
            tools={tool.name: tool for tool in tools},
            interactions=interactions,
            processor=processor,
            chat_template_kwargs=dict(chat_template_kwargs or {}),
        )
        self._loop: asyncio.AbstractEventLoop | None = None  # start_background_loop's
        self._loop_thread: threading.Thread | None = None

    # ---- the background event loop ------------------------------------------------------------------------
    def start_background_loop(self) -> None:
        """Run every batch's loops, and every `submit`ted coroutine, on one event loop in a thread of its own from
        now on (see the module docstring); a second call does nothing."""
        if self._loop is not None:
            return
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="agent_loops", daemon=True)
        self._loop_thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        """Schedule `coroutine` on the background loop (thread-safe); cancelling the future cancels its task."""
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("AgentLoopManager.submit needs the background loop: call start_background_loop() first")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def stop_background_loop(self, timeout_s: float = 30.0) -> None:
        """Cancel what still runs on the background loop, stop it and join its thread."""
        loop, thread = self._loop, self._loop_thread
        if loop is None:
            return
        self._loop, self._loop_thread = None, None

        async def cancel_all() -> None:
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout_s)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout_s)
            if not thread.is_alive():
                loop.close()

    # ---- entry points ---------------------------------------------------------------------------------------
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Run the batch's agent loops to completion (blocking; on the background loop once it is started).
        Inside a running event loop, await `agenerate_sequences` instead."""
        if self._loop is not None:
            if threading.current_thread() is self._loop_thread:
                raise RuntimeError("generate_sequences was called on the background loop; await agenerate_sequences")
            return self.submit(self.agenerate_sequences(prompts)).result()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.agenerate_sequences(prompts))
        raise RuntimeError("generate_sequences was called inside a running event loop; await agenerate_sequences")

    async def agenerate_sequences(self, prompts: DataProto) -> DataProto:
        """Run one agent loop per sample concurrently and pack the outputs (see the module docstring)."""
        if len(prompts) == 0:
            raise ValueError("generate_sequences got an empty batch; give it at least one prompt.")
        start = time.perf_counter()
        rows = [{key: values[i] for key, values in prompts.non_tensor_batch.items()} for i in range(len(prompts))]
        loop_classes = [get_agent_loop_class(self._agent_name(row)) for row in rows]  # all names checked up front
        params = self.sampling_params(prompts.meta_info)
        # With a batch seed (meta_info["seed"]) each row gets its own seed, as in single-turn rollouts, so a run
        # resumed from a checkpoint samples the same episodes; the loops derive one seed per turn from it.
        row_params = row_sampling_params(params, prompts.meta_info.get(F.SEED), len(rows))
        if not isinstance(row_params, list):
            row_params = [params] * len(rows)
        runs = (self._run_one(cls, row, p) for cls, row, p in zip(loop_classes, rows, row_params))
        outputs = await asyncio.gather(*runs)
        result = self.to_dataproto(list(outputs))
        result.meta_info[F.TIMING] = {"agent_loop/generate_sequences": time.perf_counter() - start}
        return result

    def sampling_params(self, meta_info: dict[str, Any]) -> SamplingParams:
        """Sampling of this batch, chosen as the rollout worker chooses it (`val_kwargs` for validation batches,
        `meta_info` do_sample / temperature overrides)."""
        return sampling_for_batch(self.config, meta_info)

    def _agent_name(self, row: dict[str, Any]) -> str:
        name = row.get(F.AGENT_NAME)
        return str(name) if name else self.config.agent.default_agent_loop

    async def _run_one(
        self, loop_class: type[AgentLoopBase], row: dict[str, Any], params: SamplingParams
    ) -> AgentLoopOutput:
        request_id = uuid.uuid4().hex
        try:
            return await loop_class(self.context).run(dataclasses.replace(params), request_id=request_id, **row)
        finally:
            self.router.release(request_id)

    # ---- packing --------------------------------------------------------------------------------------------
    def to_dataproto(self, outputs: list[AgentLoopOutput]) -> DataProto:
        """Pad the trajectories to (P, R) and build the batch, the per-sample extras and the metrics."""
        prompt_length, response_length = self.config.prompt_length, self.config.response_length
        longest = max(len(out.prompt_ids) for out in outputs)
        if longest > prompt_length:
            raise ValueError(
                f"a prompt has {longest} tokens after the chat template (tool schemas included), more than "
                f"actor_rollout_ref.rollout.prompt_length={prompt_length}; raise data.max_prompt_length or shorten "
                "the prompts / tool descriptions."
            )
        pad = self.tokenizer.pad_token_id
        prompts = torch.full((len(outputs), prompt_length), pad, dtype=torch.long)
        prompt_mask = torch.zeros_like(prompts)
        responses = torch.full((len(outputs), response_length), pad, dtype=torch.long)
        response_mask = torch.zeros_like(responses)
        response_attention = torch.zeros_like(responses)
        log_probs = torch.zeros((len(outputs), response_length), dtype=torch.float32)
        versions = torch.full((len(outputs), response_length), -1, dtype=torch.long)
        for i, out in enumerate(outputs):
            p, r = len(out.prompt_ids), len(out.response_ids)
            if p:
                prompts[i, prompt_length - p :] = torch.tensor(out.prompt_ids)
                prompt_mask[i, prompt_length - p :] = 1
            responses[i, :r] = torch.tensor(out.response_ids, dtype=torch.long)
            response_mask[i, :r] = torch.tensor(out.response_mask, dtype=torch.long)
            response_attention[i, :r] = 1
            log_probs[i, :r] = torch.tensor(out.response_log_probs, dtype=torch.float32)
            if out.response_policy_versions is not None:
                versions[i, :r] = torch.tensor(out.response_policy_versions, dtype=torch.long)
        attention_mask = torch.cat([prompt_mask, response_attention], dim=1)
        input_ids = torch.cat([prompts, responses], dim=1)
        tensors = {
            F.PROMPTS: prompts,
            F.RESPONSES: responses,
            F.RESPONSE_MASK: response_mask,
            F.INPUT_IDS: input_ids,
            F.ATTENTION_MASK: attention_mask,
            F.POSITION_IDS: (attention_mask.cumsum(dim=1) - 1).clamp(min=0) * attention_mask,
            F.ROLLOUT_LOG_PROBS: log_probs,
            F.ROLLOUT_POLICY_VERSIONS: versions,
        }
        non_tensors = {
            F.NUM_TURNS: [out.num_turns for out in outputs],
            F.FINISH_REASON: [out.finish_reason for out in outputs],
            **version_range(versions),
            **{key: [out.extra_fields.get(key) for out in outputs] for key in EXTRA_FIELDS},
        }
        records = [out.routed_experts for out in outputs]
        if any(record is not None for record in records):  # routing replay R3 (tool tokens after the last turn: none)
            lengths = [len(out.prompt_ids) for out in outputs]
            tensors[F.ROUTED_EXPERTS] = routing_rows(records, lengths, prompt_length, prompt_length + response_length)
        if self.processor is not None:
            rows = [out.multi_modal_inputs or {} for out in outputs]
            non_tensors[F.MULTI_MODAL_INPUTS] = rows
            tensors[F.POSITION_IDS] = torch.stack(
                [
                    row_position_ids(self.processor, ids, mask, row)
                    for ids, mask, row in zip(input_ids, attention_mask, rows)
                ]
            )
        return DataProto.from_dict(tensors, non_tensors, meta_info={F.METRICS: batch_metrics(outputs)})


def batch_metrics(outputs: list[AgentLoopOutput]) -> dict[str, float]:
    """Batch means of the loops' counters and timings, the turn statistics and the share of each finish reason."""
    metrics: dict[str, float] = {}
    for name in (f.name for f in dataclasses.fields(outputs[0].metrics)):
        values = [getattr(out.metrics, name) for out in outputs]
        if isinstance(values[0], dict):  # counts by key: each key that occurred in the batch, 0 where it did not
            for key in sorted({key for value in values for key in value}):
                metrics[f"agent/{name}/{key}/mean"] = float(np.mean([value.get(key, 0) for value in values]))
        else:
            metrics[f"agent/{name}/mean"] = float(np.mean(values))
    turns = [out.num_turns for out in outputs]
    metrics.update({"agent/num_turns/mean": float(np.mean(turns)), "agent/num_turns/max": float(max(turns))})
    for reason in ("stop", "length", "max_turns", "abort"):
        metrics[f"agent/finish_reason/{reason}"] = sum(out.finish_reason == reason for out in outputs) / len(outputs)
    return metrics
