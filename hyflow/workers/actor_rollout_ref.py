"""`ActorRolloutRefWorker`: the hybrid-engine worker, one process per device, holding composed role objects.

    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config.actor_rollout_ref, ref=True))
    wg.init_model()
    out = wg.generate_sequences(prompts)            # rollout: gathers the actor's weights into the engine first
    wg.rollout_mode(); ...; wg.trainer_mode()        # agent loops: per-request `generate_request` calls in between
    future = wg.generate_sequences_async(prompts)                  # async training (a rollout pool): no wait
    wg.update_rollout_weights_in_flight(weights, policy_version=k)  # meanwhile: its requests go on with new weights
    out = future.get()                                              # rows with tokens of both versions
    old = wg.compute_log_prob(batch)                 # old_log_probs, entropys
    ref = wg.compute_ref_log_prob(batch)             # ref_log_prob
    metrics = wg.update_actor(batch).meta_info["metrics"]
    wg.save_checkpoint("ckpt/global_step_10/actor", global_step=10)

Split placement (`trainer.placement=split`): a training group built with `rollout=False` and a rollout group built
with `actor=False` exchange weights over a `WeightChannel` (`hyflow.workers.pool_transfer`):

    host, port = train_wg.weight_channel_address()[0]
    train_wg.join_weight_channel(host, port, world) | rollout_wg.join_weight_channel(host, port, world)  # at once
    train_wg.send_weights() | rollout_wg.receive_weights(version=step)                                    # at once

Roles present are chosen by flags (`actor`, `rollout`, `ref`), never by a role string: `self.actor` is a
`DataParallelPPOActor`, `self.ref` another one without an optimizer (or, with LoRA, the actor's own module with
the adapter disabled: no second copy of the weights), and `self.rollout` the generation engine built by
`hyflow.rollout.worker_rollout.build_rollout`. Switching to generation (`rollout_mode`) streams the actor's full
weights, LoRA folded in, into the engine and wakes it; `trainer_mode` puts the engine to sleep again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any

import torch

from hyflow import fields as F
from hyflow.config import ActorRolloutRefConfig, RefConfig, RolloutConfig
from hyflow.controller import Dispatch, Worker, register
from hyflow.controller.worker import free_port, node_ip_address
from hyflow.models.lora import hf_name, merged_hf_weights
from hyflow.protocol import DataProto
from hyflow.workers import builders
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.checkpoint import ShardCheckpointer
from hyflow.workers.fsdp import build_device_mesh, move_optimizer_state, training_device
from hyflow.workers.micro_batch_loop import ForwardSettings
from hyflow.workers.pool_transfer import WeightChannel
from hyflow.workers.weight_sync import SyncStats, iter_bucketed_state

logger = logging.getLogger(__name__)


class ActorRolloutRefWorker(Worker):
    """Actor (FSDP2 training), rollout (generation engine) and reference policy in one process per device."""

    def __init__(self, config: ActorRolloutRefConfig, actor: bool = True, rollout: bool = True, ref: bool = False):
        """`config` is the finalized `actor_rollout_ref` section (`hyflow.config.load_config`: every inherited and
        per-device value filled in); the flags pick the roles."""
        if not (actor or rollout or ref):
            raise ValueError("ActorRolloutRefWorker needs at least one role: actor, rollout or ref.")
        self.config = config
        self.has_actor, self.has_rollout, self.has_ref = actor, rollout, ref
        self.actor: DataParallelPPOActor | None = None
        self.ref: DataParallelPPOActor | None = None
        self.rollout: Any = None
        self.checkpointer: ShardCheckpointer | None = None
        self.lr_scheduler: Any = None
        self._model_path: str | None = None
        self._weights_version = 0  # bumped by every actor update
        self._rollout_version = 0  # the actor weights the engine holds
        self._sync_stats: SyncStats | None = None  # of the weight sync in the current generate call, if any
        self._channel: WeightChannel | None = None  # split placement: to / from the other pool

    # ---- building ----
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Join the process group, then load and shard the models of the roles this worker holds."""
        self.init_distributed(timeout_s=self.config.nccl_timeout)
        model_config = builders.with_adapter_settings(self.config.model)  # LoRA settings of a saved adapter
        if model_config is not self.config.model:
            self.config = dataclasses.replace(self.config, model=model_config)
        builders.import_external_lib(model_config)
        path = builders.model_path(model_config, "actor_rollout_ref.model")
        self._model_path = path  # its processor files travel into checkpoints (vision-language models)
        self.tokenizer = builders.tokenizer_for(model_config, path, "actor_rollout_ref.model")
        mesh = build_device_mesh()
        if self.has_actor:
            self._init_actor(path, mesh)
        if self.has_ref:
            self._init_ref(path, mesh)
        if self.has_rollout:
            from hyflow.rollout.worker_rollout import build_rollout

            record_routing = self.config.actor.router_replay.mode == "R3"  # the engine records, the actor replays
            self.rollout = build_rollout(self.config.rollout, path, self.tokenizer, record_routing)
            self._rollout_version = self._weights_version
            if self._hands_memory_back:
                self.rollout.sleep()

    @property
    def _hands_memory_back(self) -> bool:
        """Whether the engine sleeps between generations: `rollout.free_cache_engine`, when a training role
        shares this process (a rollout-only worker of a split placement keeps its cache)."""
        return self.config.rollout.free_cache_engine and (self.has_actor or self.has_ref)

    def _init_actor(self, path: str, mesh: Any) -> None:
        actor_config = self.config.actor
        module = builders.build_policy(
            self.config.model, actor_config.fsdp_config, mesh, path, True, actor_config.freeze_vision_tower
        )
        optimizer, self.lr_scheduler = builders.build_optimizer_and_scheduler(module, actor_config.optim)
        mini_batch_size = builders.rows_per_rank(
            actor_config.ppo_mini_batch_size,
            self.config.rollout.n,
            self.world_size,
            "actor_rollout_ref.actor.ppo_mini_batch_size",
        )
        self.actor = DataParallelPPOActor(actor_config, module, optimizer, mini_batch_size)
        checkpoint = actor_config.checkpoint
        self.checkpointer = ShardCheckpointer(
            module, optimizer, self.lr_scheduler, checkpoint.save_contents, checkpoint.load_contents
        )
        self._hf_config = module.lm.config
        self._generation_config = getattr(module.lm, "generation_config", None)
        if actor_config.fsdp_config.optimizer_offload:
            move_optimizer_state(optimizer, "cpu")

    def _init_ref(self, path: str, mesh: Any) -> None:
        if self.actor is not None and self.config.model.lora_rank > 0:
            self.ref = self.actor  # the actor with its adapter disabled (see compute_ref_log_prob)
            return
        module = builders.build_policy(self.config.model, self.config.ref.fsdp_config, mesh, path, trainable=False)
        self.ref = DataParallelPPOActor(self.config.actor, module)

    def _ref_context(self):
        """With LoRA the ref is the actor's module with its adapter switched off."""
        if self.ref is self.actor:
            return self.actor.module.lm.disable_adapter()
        return contextlib.nullcontext()

    # ---- log-probs ----
    def _log_prob_settings(self, role_config: RolloutConfig | RefConfig) -> ForwardSettings:
        """The log-prob pass of the rollout (old) or ref role, as its finalized config says; the logits are
        divided by the rollout's temperature, so these are the log-probs of the sampling distribution."""
        dynamic = role_config.log_prob_use_dynamic_bsz
        return ForwardSettings(
            micro_batch_size=role_config.log_prob_micro_batch_size_per_gpu,
            max_token_len=role_config.log_prob_max_token_len_per_gpu if dynamic else None,
            temperature=self.config.rollout.temperature,
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """`old_log_probs` and `entropys` (B, R) of the responses under the current actor."""
        self._require(self.actor, "compute_log_prob", "actor")
        settings = self._log_prob_settings(self.config.rollout)
        if self.config.actor.router_replay.mode == "R2":  # this pass's routing is what the update replays
            log_probs, entropys, routed = self.actor.compute_log_prob_and_routing(data, settings)
            tensors = {F.OLD_LOG_PROBS: log_probs, F.ENTROPYS: entropys, F.ROUTED_EXPERTS: routed}
            return DataProto.from_dict(tensors, meta_info={})
        log_probs, entropys = self.actor.compute_log_prob(data, settings, calculate_entropy=True)
        return DataProto.from_dict({F.OLD_LOG_PROBS: log_probs, F.ENTROPYS: entropys}, meta_info={})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """`ref_log_prob` (B, R) of the responses under the reference policy."""
        self._require(self.ref, "compute_ref_log_prob", "ref")
        settings = self._log_prob_settings(self.config.ref)
        with self._ref_context():
            log_probs, _ = self.ref.compute_log_prob(data, settings)
        return DataProto.from_dict({F.REF_LOG_PROB: log_probs}, meta_info={})

    # ---- training ----
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update over the batch, then one LR-scheduler step; metrics in `meta_info["metrics"]`. A batch
        without `old_log_probs` (the trainer skipped their pass) is trained on-policy in exactly one optimizer step."""
        self._require(self.actor, "update_actor", "actor")
        offload_optimizer = self.actor.config.fsdp_config.optimizer_offload
        if offload_optimizer:
            move_optimizer_state(self.actor.optimizer, training_device())
        metrics = self.actor.update_policy(data, temperature=self.config.rollout.temperature)  # as the old log-probs
        self.lr_scheduler.step()
        if offload_optimizer:
            move_optimizer_state(self.actor.optimizer, "cpu")
        self._weights_version += 1
        return DataProto(meta_info={F.METRICS: metrics})

    # ---- generation ----
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate responses with the rollout engine, holding the actor's latest weights."""
        self._require(self.rollout, "generate_sequences", "rollout")
        start, captures = time.perf_counter(), self.rollout.cuda_graph_captures
        self._sync_stats = None
        self.rollout_mode()
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the weight copies belong to rollout_mode's time
        woke = time.perf_counter()
        try:
            output = self.rollout.generate_sequences(prompts)
        finally:
            generated = time.perf_counter()
            self.trainer_mode()
        timing = {
            "rollout_mode": woke - start,
            "generate": generated - woke,
            "trainer_mode": time.perf_counter() - generated,
        }
        if self._sync_stats is not None:  # this call synced the weights (part of rollout_mode)
            timing["weight_sync"] = self._sync_stats.seconds
        output.meta_info[F.TIMING] = {f"gen/{name}": seconds for name, seconds in timing.items()}
        captured = self.rollout.cuda_graph_captures - captures  # > 0 after step 1: the KV cache moved (see speed.md)
        metrics = output.meta_info.setdefault(F.METRICS, {})
        metrics["rollout/cuda_graph_captures"] = captured
        if self._sync_stats is not None:
            metrics.update(self._sync_stats.metrics())  # rollout/weight_sync_gb, _comm_gb, _buckets, _wait_s, _s
        return output

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    async def generate_request(
        self, prompt_ids: list[int], sampling_params: Any, request_id: str, **vision: Any
    ) -> Any:
        """One turn of an agent loop: `await` the engine's async per-request API and return its
        `CompletionOutput` (token ids, log-probs, finish reason). Concurrent calls share the engine's continuous
        batching (on Ray, an async method makes this an async actor: calls of it run concurrently, the other
        methods one at a time). The agent-loop manager calls it on one worker per conversation
        (`hyflow.agent.server.WorkerServer`), between the group's `rollout_mode()` and `trainer_mode()`.
        `vision`: `multi_modal_inputs=` of a vision-language model's conversation (hyflow.agent.server)."""
        self._require(self.rollout, "generate_request", "rollout")
        return await self.rollout.generate(prompt_ids, sampling_params, request_id=request_id, **vision)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    async def generate_sequences_async(self, prompts: DataProto) -> DataProto:
        """`generate_sequences` for asynchronous training: every row is a request of the engine's async step loop,
        so an `update_rollout_weights_in_flight` call that arrives meanwhile pauses it at a step boundary, loads the
        new weights and resumes (on Ray both run at once: async methods make this an async actor). Rows then hold
        tokens of two versions (`rollout_policy_versions`). The group call does not block: it returns a future
        (`.get()`). No weight sync from this worker's actor and no `trainer_mode`: the engine stays awake."""
        self._require(self.rollout, "generate_sequences_async", "rollout")
        self._require_engine("generate_sequences_async")
        await self.rollout.async_engine.wake()
        start = time.perf_counter()
        output = await self.rollout.generate_sequences_async(prompts)
        output.meta_info[F.TIMING] = {"gen/generate": time.perf_counter() - start}
        return output

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def update_rollout_weights_in_flight(
        self, weights: list[tuple[str, torch.Tensor]] | None = None, policy_version: int | None = None
    ) -> dict[str, float]:
        """Load new weights into the engine while requests run: pause at the step boundary, load, resume
        (EngineRollout.update_weights_in_flight; the KV cache of running requests as `rollout.partial_rollout_kv`
        says). `weights`: HF-named tensors (e.g. from the trainer pool) as `policy_version` (None: one more);
        None: this worker's own actor's, gathered from its FSDP2 shards, as its version. Returns metrics."""
        self._require(self.rollout, "update_rollout_weights_in_flight", "rollout")
        self._require_engine("update_rollout_weights_in_flight")
        start, own = time.perf_counter(), weights is None
        if own:
            self._require(self.actor, "update_rollout_weights_in_flight(weights=None)", "actor")
            weights, policy_version = self.actor_weights(), self._weights_version
        await self.rollout.update_weights_in_flight(weights, policy_version)
        if own:
            self._rollout_version = policy_version
        return {
            "rollout/weight_update_seconds": time.perf_counter() - start,
            "rollout/policy_version": float(self.rollout.policy_version),
        }

    def _require_engine(self, method: str) -> None:
        if not hasattr(self.rollout, "update_weights_in_flight"):
            raise ValueError(
                f"ActorRolloutRefWorker.{method} needs hyflow's engine (actor_rollout_ref.rollout.name=hyflow with "
                f"a model it implements); this worker's rollout is {type(self.rollout).__name__}."
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rollout_mode(self) -> None:
        """Wake the engine and, if the actor changed since the last sync, stream its full weights into it.
        (A group method too: agent loops that call the engine's async API directly bracket their run with it.)"""
        self._require(self.rollout, "rollout_mode", "rollout")
        self.rollout.wake()
        if self.actor is not None and self._rollout_version != self._weights_version:
            self._sync_stats = SyncStats()
            weights = self.actor_weights(self._sync_stats, for_own_engine=True)
            self.rollout.load_weights(weights, policy_version=self._weights_version)
            self._rollout_version = self._weights_version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def trainer_mode(self) -> None:
        """Hand the engine's memory (KV cache) back to training when `rollout.free_cache_engine`."""
        self._require(self.rollout, "trainer_mode", "rollout")
        if self._hands_memory_back:
            self.rollout.sleep()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def actor_weights(
        self, stats: SyncStats | None = None, for_own_engine: bool = False, dtype: torch.dtype | None = None
    ):
        """The actor's weights under Hugging Face names, LoRA folded in, moved from the FSDP2 shards in buckets of
        `rollout.update_weights_bucket_megabytes` (`stats` counts what moved), cast to `dtype` when given.
        `for_own_engine`: for this worker's engine: in its dtype, each TP rank receiving only its slices (without
        LoRA: its merge needs the full fp32 tensors)."""
        model_config = self.config.model
        scaling = model_config.lora_alpha / model_config.lora_rank if model_config.lora_rank > 0 else 0.0
        bucket_bytes = self.config.rollout.update_weights_bucket_megabytes << 20
        engine = getattr(self.rollout, "engine", None) if for_own_engine and not scaling else None  # hyflow's
        slices = None if engine is None else (lambda name: self.rollout.tp_weight_slices(hf_name(name)))
        dtype = dtype if engine is None else engine.dtype
        if scaling:
            dtype = None  # LoRA's merge needs the full-precision tensors
        weights = iter_bucketed_state(self.actor.module, bucket_bytes, stats, slices, dtype)
        return merged_hf_weights(weights, scaling)

    # ---- weight transfer between pools (split placement) ----
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_channel_address(self) -> tuple[str, int]:
        """(IP, free port) of this worker's node: training rank 0's answer hosts the channel's store."""
        return node_ip_address(), free_port()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_weight_channel(self, host: str, port: int, world_size: int, timeout_s: float = 600.0) -> None:
        """Join the channel as its sender (training rank 0) or as receiver 1 + rank (a rollout-only worker); the
        other training ranks take part in the gather only. Blocks until every member joined."""
        if self.has_actor:
            if self.rank == 0:
                self._channel = WeightChannel.join(host, port, 0, world_size, timeout_s)
            return
        self._require(self.rollout, "join_weight_channel", "rollout")
        self._channel = WeightChannel.join(host, port, 1 + self.rank, world_size, timeout_s)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def send_weights(self) -> dict[str, float]:
        """Gather the actor's full weights bucket by bucket (every training rank), cast to the rollout engines'
        dtype (fp32 master weights for bf16 engines move half the bytes; the engines would round them alike), and
        broadcast them from rank 0; returns what moved (`rollout/weight_transfer_*`) on rank 0, {} on the others."""
        from hyflow.rollout.worker_rollout import engine_dtype

        self._require(self.actor, "send_weights", "actor")
        dtype = getattr(torch, engine_dtype(self.config.rollout))
        weights = ((n, t.to(dtype) if t.is_floating_point() else t) for n, t in self.actor_weights(dtype=dtype))
        if self._channel is None:  # a training rank > 0: its shards go into rank 0's gather
            for _ in weights:
                pass
            return {}
        stats = self._channel.send(weights, self.config.rollout.update_weights_bucket_megabytes << 20)
        return {
            "rollout/weight_transfer_gb": stats.num_bytes / 1e9,
            "rollout/weight_transfer_buckets": stats.num_buckets,
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def receive_weights(self, version: int) -> None:
        """Load the weights training rank 0 broadcasts into the engine; they are those of training step `version`
        (tokens sampled from now on carry it). Safe while agent-loop requests run (`generate_request`): hyflow's
        engine pauses them at a step boundary, receives the buckets in a worker thread and resumes them under the
        new weights (`EngineRollout.update_weights_in_flight`). A blocking `generate_sequences` call finishes
        first: it holds the worker's event loop."""
        self._require(self.rollout, "receive_weights", "rollout")
        assert self._channel is not None, "join_weight_channel first"
        self.rollout.wake()
        if hasattr(self.rollout, "update_weights_in_flight"):
            await self.rollout.update_weights_in_flight(self._channel.receive(), policy_version=version)
        else:  # the transformers rollout serves one call at a time
            self.rollout.load_weights(self._channel.receive(), policy_version=version)

    # ---- checkpoints ----
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0) -> None:
        """Save the actor's model, optimizer, scheduler and RNG state to `local_path` (atomically)."""
        self._require(self.actor, "save_checkpoint", "actor")
        info = {"kind": "policy", "global_step": global_step, "lora": builders.lora_info(self.config.model)}
        assets = builders.hf_assets_saver(self._hf_config, self.tokenizer, self._generation_config, self._model_path)
        self.checkpointer.save(local_path, info=info, hf_assets=assets)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> dict[str, Any]:
        """Restore the actor from `local_path`; the engine gets the restored weights on the next generation, as the
        policy version of the checkpoint's step (the number of updates behind it, as in the run that saved it)."""
        self._require(self.actor, "load_checkpoint", "actor")
        info = self.checkpointer.load(local_path)
        self._weights_version = int(info.get("global_step") or self._weights_version + 1)
        self._rollout_version = -1  # whatever the engine holds is not these weights
        return info

    def _require(self, role: Any, method: str, name: str) -> None:
        if role is None:
            raise ValueError(
                f"ActorRolloutRefWorker.{method} needs the {name} role, which this worker was built without "
                f"(pass {name}=True and call init_model first)."
            )
