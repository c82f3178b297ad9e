"""verl keys that hyflow reads differently: renamed, accepted as no-ops, or rejected by name.

A verl launch script should run by changing the module name. Every key of verl's generated `ppo_trainer` config
(listed with its default in `verl_keys.yaml`, from verl v0.9.0 back to v0.7.0; see scripts/extract_verl_keys.py)
is one of:

- a hyflow key (same name, same meaning);
- `RENAMED`: a verl spelling read under hyflow's name (one notice each), e.g. `optim.clip_grad` -> `grad_clip`;
- `IGNORED`: a setting of an engine or trick hyflow does not have, whose absence changes no result (speed or
  memory knobs of vLLM/SGLang, profilers, torch.compile switches); accepted with a notice that says so;
- `UNSUPPORTED`: a feature hyflow does not implement. Set to verl's default (the feature off) it is accepted with
  a notice; set to anything else the loader stops and names the feature.

`SUPPORTED_VALUES_ONLY` are hyflow keys whose other values are rejected. verl's Ulysses sequence parallelism
(`ulysses_sequence_parallel_size > 1`) is folded into data parallelism by `hyflow.config.sequence_parallel`.

Patterns are dotted keys where `*` matches one or more key parts (shell-style, via `fnmatch`); a pattern also
covers every key below it.
"""

from __future__ import annotations

import functools
from fnmatch import fnmatchcase
from importlib import resources
from typing import Any

import yaml

_NOT_FOUND = object()

# verl key (pattern) -> hyflow key, with the same `*` prefix substituted. Applied until none matches.
RENAMED: dict[str, str] = {
    "ray_init": "trainer.ray_init",
    "ray_kwargs.ray_init": "trainer.ray_init",
    "*.optim.warmup_style": "*.optim.lr_scheduler_type",
    "*.optim.clip_grad": "*.grad_clip",  # verl >= 0.7 moved the actor's / critic's grad_clip here
    "critic.fsdp": "critic.model.fsdp_config",  # verl >= 0.8
    "*.fsdp_config.dtype": "*.fsdp_config.mixed_precision.param_dtype",
    # verl >= 0.8 also spells the sequence-parallel size inside the engine's section
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    ),
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size": (
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size"
    ),
    "critic.model.fsdp_config.ulysses_sequence_parallel_size": "critic.ulysses_sequence_parallel_size",
    "actor_rollout_ref.actor.use_remove_padding": "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.actor.use_fused_kernels": "actor_rollout_ref.model.use_fused_kernels",
    "*.model.lora.adapter_path": "*.model.lora_adapter_path",
    "reward.custom_reward_function": "custom_reward_function",  # verl >= 0.8 groups rewards under `reward`
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward_manager.name": "reward_model.reward_manager",  # verl 0.8's top-level spelling
    "reward.reward_model": "reward_model",
    "reward.reward_kwargs": "reward_model.reward_kwargs",
    "reward.sandbox_fusion": "reward_model.sandbox_fusion",
    "sandbox_fusion": "reward_model.sandbox_fusion",
    "reward.num_workers": "reward_model.num_workers",
    "reward_model.model_path": "reward_model.model.path",
    "reward_model.reward_kwargs.overlong_buffer_cfg": "reward_model.overlong_buffer",
    # verl reports the expert load of the rollout's routing; hyflow that of the actor update's forward
    "actor_rollout_ref.rollout.moe_load_balance_metrics_interval": (
        "actor_rollout_ref.actor.moe_load_balance_metrics_interval"
    ),
}

# verl spellings of values -> hyflow's, for keys matching the pattern.
VALUE_ALIASES: dict[str, dict[Any, Any]] = {
    "*_dtype": {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"},
}

_VLLM = "a vLLM/SGLang engine option; hyflow's own engine has no such setting, so it changes nothing"
_COMPILE = "hyflow decides where to use torch.compile itself; results are the same either way"
_MEMORY = "a memory-saving variant of the same computation in verl; hyflow computes the same values its own way"
_PROFILE = "verl's profiler integration; hyflow records no profiles (wrap `hyflow train` in nsys or torch.profiler)"
_SEED = "verl seeds this component separately; hyflow seeds every worker from trainer.seed"
_LAYOUT = "the inference engine's parallel layout; hyflow runs one engine per tensor-parallel group with the same "
_LAYOUT += "sampling settings"
_RM_SERVER = (
    "verl's reward loop serves the reward model on an inference engine; hyflow scores with the reward model on its "
    "own worker group (reward_model.enable), so the scores are the same"
)

IGNORED: dict[str, str] = {
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": "hyflow's engine records the routing whenever "
    "actor_rollout_ref.actor.router_replay.mode=R3",
    "actor_rollout_ref.rollout.engine_kwargs": _VLLM,
    "actor_rollout_ref.rollout.load_format": "how vLLM loads its first weights; hyflow's engine always gets "
    "the actor's weights from the trainer",
    "actor_rollout_ref.rollout.layered_summon": _MEMORY,
    "actor_rollout_ref.rollout.disable_log_stats": _VLLM,
    "actor_rollout_ref.rollout.enable_chunked_prefill": _VLLM,
    "actor_rollout_ref.rollout.enable_prefix_caching": "hyflow's engine always shares prompt prefixes",
    "actor_rollout_ref.rollout.checkpoint_engine": "how verl ships weights to its inference engine; hyflow's "
    "engine takes them from the trainer in place",
    "actor_rollout_ref.rollout.multi_stage_wake_up": _MEMORY,
    "actor_rollout_ref.rollout.cudagraph_capture_sizes": "hyflow's engine picks its CUDA-graph batch sizes itself",
    "actor_rollout_ref.rollout.scheduling_policy": _VLLM,
    "actor_rollout_ref.rollout.skip_tokenizer_init": _VLLM,
    "actor_rollout_ref.rollout.limit_images": _VLLM,
    "actor_rollout_ref.rollout.prometheus": "an inference-server metrics exporter",
    "actor_rollout_ref.rollout.data_parallel_size": _LAYOUT,
    "actor_rollout_ref.rollout.expert_parallel_size": _LAYOUT,
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": _LAYOUT,
    "actor_rollout_ref.rollout.n_gpus_per_node": "the size of a separate rollout pool (rollout.nnodes > 0)",
    "actor_rollout_ref.rollout.seed": _SEED,
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": "a debugging check of verl's "
    "tokenizer; hyflow builds multi-turn token ids by construction",
    "actor_rollout_ref.ref.rollout_n": "verl's copy of actor_rollout_ref.rollout.n",
    "actor_rollout_ref.actor.calculate_entropy": "hyflow computes the entropy itself where the loss or a metric "
    "needs it",
    "*.use_torch_compile": _COMPILE,
    "*.entropy_from_logits_with_chunking": _MEMORY,
    "*.entropy_from_logits_chunk_size": _MEMORY,
    "*.entropy_checkpointing": _MEMORY,
    "*.model.tiled_mlp": _MEMORY,
    "*.model.lora.merge": "hyflow always folds the LoRA adapter into the weights it hands its engine",
    "*.enable_activation_offload": _MEMORY,
    "*.model.fused_kernel_options": "how verl's fused log-prob kernels are built; they compute the same values",
    "*.pad_to_length": "padding every batch to a fixed length only changes the shapes the kernels see",
    "*.pad_to_length_bucket": "padding every batch to a fixed length only changes the shapes the kernels see",
    "*.fsdp_config.use_orig_params": "an FSDP1 switch; FSDP2 (`fully_shard`) always keeps the original parameters",
    "*.fsdp_config.forward_only": "verl's marker for a frozen model; hyflow knows which of its models train",
    "*.fsdp_config.strategy": "verl's copy of the section's `strategy` (checked there)",
    "*.fsdp_config.seed": _SEED,
    "*.data_loader_seed": _SEED,
    "*.use_shm": "verl's shared-memory copy of the model files only speeds up loading",
    "*.profiler": _PROFILE,
    "global_profiler": _PROFILE,
    "trainer.profile_steps": _PROFILE,
    "trainer.ray_init.timeline_json_file": "a Ray timeline dump for profiling",
    "ray_kwargs.timeline_json_file": "a Ray timeline dump for profiling",
    "reward_model.use_reward_loop": "verl's choice between its reward loop and its older reward workers, which "
    "give the same scores; hyflow has one reward path",
    "reward_model.model.use_fused_kernels": "how verl's fused kernels are built; they compute the same values",
    "reward_model.num_workers": "the number of verl's reward-loop processes; hyflow's reward manager scores in the "
    "trainer (reward_model.reward_manager=prime for a process pool)",
    "reward_model.rollout": _RM_SERVER,
    "reward_model.sandbox_fusion": "hyflow does not call the SandboxFusion service: each row is scored by the "
    "scorer registered for its data_source, and a data source without one stops the run with its name",
    "reward_model.reward_kwargs.max_resp_len": "hyflow's overlong penalty takes L_max from data.max_response_length "
    "(keep the two equal, as verl's DAPO scripts do)",
    "trainer.ray_wait_register_center_timeout": "hyflow's worker groups have no register center",
    "trainer.use_legacy_worker_impl": "hyflow has one worker implementation",
    "trainer.use_v1": "the choice between verl's two trainer implementations; hyflow has one",
    "trainer.esi_redundant_time": "a checkpoint timing hint for one cloud's elastic instances",
    "distillation.teacher_key": "the per-sample field that picks one of several teachers; hyflow has one teacher",
    "distillation.teacher_models.teacher_model.key": "the distillation.teacher_key value routed to this teacher; "
    "hyflow's one teacher scores every sample",
    "distillation.teacher_models.teacher_model.num_replicas": "the teacher's inference replicas; hyflow's teacher "
    "is a forward pass in every training process",
    "distillation.teacher_models.teacher_model.inference": "the teacher's vLLM/SGLang server settings; hyflow "
    "scores with a forward pass (batched as actor_rollout_ref.ref.log_prob_*, at the rollout's temperature)",
    "data.return_multi_modal_inputs": "hyflow always keeps a processor's outputs per row (multi_modal_inputs)",
}

UNSUPPORTED: dict[str, str] = {
    "*.megatron": "verl's Megatron-LM backend; hyflow trains with FSDP2 (strategy=fsdp)",
    "model_engine": "verl's choice of training engine; hyflow trains with FSDP2 (model_engine=dp)",
    "*.model.use_liger": "Liger kernels",
    "*.model.hf_config_path": "a Hugging Face config read from another folder than model.path",
    "*.model.mtp": "multi-token prediction",
    "*.model.lora": "verl's Megatron-Bridge LoRA options (use model.lora_rank / lora_alpha / target_modules)",
    "*.full_determinism": "deterministic kernels",
    "*.qat": "quantization-aware training",
    "*.router_replay.record_file": "recording MoE routing to files (hyflow carries it in the batch)",
    "*.router_replay.replay_file": "replaying MoE routing from files (hyflow carries it in the batch)",
    "actor_rollout_ref.ref.router_replay": "a routing replay setting of the ref's own (the reference replays what "
    "the batch carries: actor_rollout_ref.actor.router_replay.mode)",
    "*.freeze_vision_tower": "multimodal models",
    "*.loss_scale_factor": "a constant loss scale",
    "*.checkpoint.async_save": "asynchronous checkpointing",
    "*.checkpoint.strict": "non-strict checkpoint loading",
    "*.checkpoint.mbridge_config": "Megatron-Bridge checkpoints",
    "*.optim.optimizer": "optimizers other than AdamW",
    "*.optim.optimizer_impl": "optimizer implementations other than torch.optim",
    "*.optim.zero_indexed_step": "switching the lr schedule's step indexing",
    "*.optim.override_optimizer_config": "extra optimizer options (Megatron's distributed optimizer)",
    "actor_rollout_ref.actor.tau_pos": "the SAPO policy loss",
    "actor_rollout_ref.actor.tau_neg": "the SAPO policy loss",
    "actor_rollout_ref.actor.calculate_sum_pi_squared": "the sum-of-squared-probabilities statistic",
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": "the sum-of-squared-probabilities statistic",
    "actor_rollout_ref.actor.use_prefix_grouper": "prefix-grouped forward passes",
    "actor_rollout_ref.rollout.nnodes": "a rollout resource pool separate from training",
    "actor_rollout_ref.rollout.logprobs_mode": "other kinds of rollout log-probs than verl's default",
    "actor_rollout_ref.rollout.over_sample_rate": "over-sampling prompts and aborting the slowest rollouts",
    "actor_rollout_ref.rollout.quantization": "quantized rollout",
    "actor_rollout_ref.rollout.quantization_config_file": "quantized rollout",
    "actor_rollout_ref.rollout.mtp": "speculative decoding",
    "actor_rollout_ref.rollout.disaggregation": "prefill/decode disaggregation",
    "actor_rollout_ref.rollout.skip": "replaying rollouts from a dump",
    "actor_rollout_ref.rollout.skip_rollout": "replaying rollouts from a dump",
    "actor_rollout_ref.rollout.skip_dump_dir": "replaying rollouts from a dump",
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": "re-rendering multi-turn history with "
    "the inference chat template",
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": "repeated multi-turn rollouts",
    "actor_rollout_ref.rollout.agent.custom_async_server": "custom asynchronous rollout servers",
    "actor_rollout_ref.rollout.trace": "rollout tracing backends (weave, mlflow)",
    "data.audio_key": "multimodal data",
    "data.image_patch_size": "multimodal data",
    "data.mm_processor_kwargs": "multimodal data",
    "data.continuous_token": "multimodal data",
    "data.custom_cls": "custom dataset classes",
    "data.sampler": "custom curriculum samplers",
    "data.datagen": "dynamic data generation",
    "data.gen_batch_size": "a generation batch larger than the training batch",
    "data.tool_config_path": "tool schemas in the dataset's prompts",
    "data.function_tool_path": "tool schemas in the dataset's prompts",
    "algorithm.rollout_correction.rollout_rs_threshold_lower": "verl's older separate lower rejection bound (give "
    "k1 bounds as 'lower_upper' in rollout_rs_threshold)",
    "algorithm.rollout_correction.rollout_token_veto_threshold": "verl's older token veto (use rollout_rs=token_k1 "
    "with a lower bound)",
    "algorithm.filter_groups.max_inflight_gen_batches": "overlapping generation batches for group filtering",
    "distillation.n_gpus_per_node": "a resource pool for the teacher separate from training (hyflow's teacher "
    "runs in every training process, offloaded as actor_rollout_ref.ref.fsdp_config says)",
    "distillation.nnodes": "a resource pool for the teacher separate from training",
    "distillation.teacher_models.*": "several teachers chosen per sample by distillation.teacher_key (hyflow "
    "distills from one teacher, distillation.teacher_models.teacher_model)",
    "distillation.distillation_loss.policy_loss_mode": "a policy loss for the distillation term of its own (hyflow's "
    "distillation advantage goes through the actor's policy loss, actor_rollout_ref.actor.policy_loss)",
    "distillation.distillation_loss.clip_ratio*": "PPO clipping of a distillation term of its own (hyflow's "
    "distillation advantage is clipped by actor_rollout_ref.actor.clip_ratio*)",
    "reward_model.enable_resource_pool": "a resource pool for the reward model separate from training",
    "reward_model.n_gpus_per_node": "a resource pool for the reward model separate from training",
    "reward_model.nnodes": "a resource pool for the reward model separate from training",
    "reward_model.reward_loop_source": "custom reward-loop classes",
    "reward_model.reward_loop_module_path": "custom reward-loop classes",
    "reward_model.reward_loop_class_name": "custom reward-loop classes",
    "reward_model.model.override_config": "overriding the reward model's Hugging Face config",
    "reward.reward_manager.source": "reward managers loaded from a module",
    "reward.reward_manager.module": "reward managers loaded from a module",
    "reward_manager.source": "reward managers loaded from a module",
    "reward_manager.module": "reward managers loaded from a module",
    "trainer.default_hdfs_dir": "HDFS checkpoint copies (use a local or mounted default_local_dir)",
    "trainer.v1": "the asynchronous modes of verl's v1 trainer",
    "skip": "skipping rollouts by replaying dumps",
    "transfer_queue": "verl's TransferQueue data system",
}

# verl defaults that do not switch the feature off (image_key="images" reads images when rows have them)
DEFAULT_IS_NOT_OFF: tuple[str, ...] = ("data.image_key", "data.video_key", "data.audio_key")

# hyflow key pattern -> (values hyflow supports, what the other values would have meant)
SUPPORTED_VALUES_ONLY: dict[str, tuple[tuple[Any, ...], str]] = {
    "*.strategy": (("fsdp", "fsdp2"), "megatron is verl's Megatron-LM backend; hyflow trains with FSDP2"),
    "actor_rollout_ref.hybrid_engine": ((True,), "hyflow always colocates actor, rollout and ref (hybrid engine)"),
    "critic.model.lora_rank": ((0,), "LoRA for the critic; hyflow trains the critic's full weights"),
    "critic.model.lora_adapter_path": ((None,), "LoRA for the critic; hyflow trains the critic's full weights"),
}


def _covers(pattern: str, key: str) -> bool:
    return fnmatchcase(key, pattern) or fnmatchcase(key, pattern + ".*")


def _first_reason(table: dict[str, str], key: str) -> str | None:
    return next((reason for pattern, reason in table.items() if _covers(pattern, key)), None)


def ignored_reason(key: str) -> str | None:
    """Why a verl key is accepted and has no effect in hyflow, or None if it is not such a key."""
    return _first_reason(IGNORED, key)


def unsupported_reason(key: str) -> str | None:
    """What verl feature a key belongs to that hyflow does not implement, or None."""
    return _first_reason(UNSUPPORTED, key)


def _rename_once(key: str) -> str | None:
    for pattern, target in RENAMED.items():
        for candidate in (pattern, pattern + ".*"):
            if not fnmatchcase(key, candidate):
                continue
            if pattern.startswith("*."):
                suffix = pattern[1:]  # ".optim.warmup_style"
                head, _, tail = key.partition(suffix)
                return head + target[1:] + tail
            return target + key[len(pattern) :]
    return None


def renamed_key(key: str) -> str | None:
    """hyflow's name for a key verl spells differently (`ray_init.num_cpus` -> `trainer.ray_init.num_cpus`);
    None when `key` is not a verl spelling. Chains are followed (`reward.reward_model.model_path` ->
    `reward_model.model_path` -> `reward_model.model.path`)."""
    renamed = None
    for _ in range(4):  # chains are at most a couple of links long
        step = _rename_once(key)
        if step is None:
            return renamed
        key = renamed = step
    return renamed


def aliased_value(key: str, value: Any) -> Any:
    """hyflow's spelling of a value verl spells differently (`model_dtype=bfloat16` -> `bf16`)."""
    for pattern, aliases in VALUE_ALIASES.items():
        if isinstance(value, str) and fnmatchcase(key, pattern) and value in aliases:
            return aliases[value]
    return value


def unsupported_value_reason(key: str, value: Any) -> str | None:
    """For a key hyflow supports only at some values: why `value` is not one of them (None when it is)."""
    for pattern, (allowed, reason) in SUPPORTED_VALUES_ONLY.items():
        if value is not None and fnmatchcase(key, pattern) and value not in allowed:
            shown = ", ".join(repr(a) for a in allowed)
            return f"{key}={value!r} is not implemented by hyflow ({reason}). Fix: set {key} to one of: {shown}."
    return None


@functools.cache
def verl_keys() -> dict[str, Any]:
    """verl's `ppo_trainer` leaf keys and their defaults (see the module docstring)."""
    text = resources.files("hyflow.config").joinpath("verl_keys.yaml").read_text()
    return yaml.safe_load(text)


def is_verl_default(key: str, value: Any) -> bool:
    """Whether `value` is verl's default for `key` and that default leaves the feature off (a key verl does not
    list has no default)."""
    if key in DEFAULT_IS_NOT_OFF:
        return False
    default = verl_keys().get(key, _NOT_FOUND)
    if default is _NOT_FOUND or (isinstance(default, str) and "${" in default):
        return False
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default
    return value == default
