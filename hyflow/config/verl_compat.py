"""verl keys that hyflow reads differently: renamed, accepted as no-ops, or rejected by name.

A verl launch script should run by changing the module name. Keys that do exist in verl but mean nothing to
hyflow are sorted into three tables here, so that the loader never silently drops a setting:

- `RENAMED`: verl spellings read under hyflow's name (one notice each).
- `IGNORED`: settings of engines or tricks hyflow does not have, whose absence changes no result (speed or
  memory knobs of vLLM/SGLang, torch.compile switches, shared-memory loading); accepted with a notice that says so.
- `UNSUPPORTED`: features hyflow does not implement; the loader stops and names them.

Patterns are dotted keys where `*` matches one or more key parts (shell-style, via `fnmatch`); a pattern also covers
every key below it.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

# verl key (pattern) -> hyflow key, with the same `*` prefix substituted.
RENAMED: dict[str, str] = {
    "ray_init": "trainer.ray_init",
    "*.optim.warmup_style": "*.optim.lr_scheduler_type",
}

_VLLM = "a vLLM/SGLang engine option; hyflow's own engine has no such setting, so it changes nothing"
_COMPILE = "hyflow decides where to use torch.compile itself; results are the same either way"
_MEMORY = "a memory-saving variant of the same computation in verl; hyflow computes the same values its own way"

IGNORED: dict[str, str] = {
    "actor_rollout_ref.rollout.engine_kwargs": _VLLM,
    "actor_rollout_ref.rollout.load_format": "how vLLM loads its first weights; hyflow's engine always gets "
    "the actor's weights from the trainer",
    "actor_rollout_ref.rollout.layered_summon": _MEMORY,
    "actor_rollout_ref.rollout.disable_log_stats": _VLLM,
    "actor_rollout_ref.rollout.enable_chunked_prefill": _VLLM,
    "actor_rollout_ref.rollout.enable_prefix_caching": "hyflow's engine always shares prompt prefixes",
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes": _MEMORY,
    "actor_rollout_ref.rollout.multi_stage_wake_up": _MEMORY,
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": "a debugging check of verl's "
    "tokenizer; hyflow builds multi-turn token ids by construction",
    "*.use_torch_compile": _COMPILE,
    "*.entropy_from_logits_with_chunking": _MEMORY,
    "*.entropy_checkpointing": _MEMORY,
    "*.use_shm": "verl's shared-memory copy of the model files only speeds up loading",
    "trainer.ray_wait_register_center_timeout": "hyflow's worker groups have no register center",
    "trainer.use_legacy_worker_impl": "hyflow has one worker implementation",
    "trainer.esi_redundant_time": "a checkpoint timing hint for one cloud's elastic instances",
    "data.return_multi_modal_inputs": "hyflow always keeps a processor's outputs per row (multi_modal_inputs)",
}

_SEQ_PARALLEL = "Ulysses sequence parallelism; hyflow shards with FSDP2 only (keep it at 1)"

UNSUPPORTED: dict[str, str] = {
    "*.megatron": "verl's Megatron-LM backend; hyflow trains with FSDP2 (strategy=fsdp)",
    "actor_rollout_ref.model.use_liger": "Liger kernels",
    "actor_rollout_ref.model.fused_kernel_options": "verl's fused log-prob kernels",
    "*.enable_activation_offload": "activation offloading (use enable_gradient_checkpointing)",
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": "re-rendering multi-turn history with "
    "the inference chat template",
    "actor_rollout_ref.rollout.trace": "rollout tracing backends (weave, mlflow)",
    "actor_rollout_ref.actor.checkpoint.async_save": "asynchronous checkpointing",
    "data.custom_cls": "custom dataset classes",
    "data.sampler": "custom curriculum samplers",
    "data.datagen": "dynamic data generation",
    "algorithm.use_pf_ppo": "PF-PPO sample reweighting",
    "algorithm.pf_ppo": "PF-PPO sample reweighting",
    "reward_model.sandbox_fusion": "the SandboxFusion code-execution service",
    "trainer.default_hdfs_dir": "HDFS checkpoint copies (use a local or mounted default_local_dir)",
    "trainer.ray_init.timeline_json_file": "Ray timeline dumps",
    "trainer.profile_steps": "verl's profiler integration",
    "*.profiler": "verl's profiler integration",
    "global_profiler": "verl's profiler integration",
    "transfer_queue": "verl's TransferQueue data system",
}

# key pattern -> (values hyflow supports, what the other values would have meant)
SUPPORTED_VALUES_ONLY: dict[str, tuple[tuple[Any, ...], str]] = {
    "*.strategy": (("fsdp", "fsdp2"), "megatron is verl's Megatron-LM backend; hyflow trains with FSDP2"),
    "*.ulysses_sequence_parallel_size": ((1,), _SEQ_PARALLEL),
    "actor_rollout_ref.hybrid_engine": ((True,), "hyflow always colocates actor, rollout and ref (hybrid engine)"),
}


def _covers(pattern: str, key: str) -> bool:
    return fnmatchcase(key, pattern) or fnmatchcase(key, pattern + ".*")


def ignored_reason(key: str) -> str | None:
    """Why a verl key is accepted and has no effect in hyflow, or None if it is not such a key."""
    return next((reason for pattern, reason in IGNORED.items() if _covers(pattern, key)), None)


def unsupported_reason(key: str) -> str | None:
    """What verl feature a key belongs to that hyflow does not implement, or None."""
    return next((reason for pattern, reason in UNSUPPORTED.items() if _covers(pattern, key)), None)


def renamed_key(key: str) -> str | None:
    """hyflow's name for a key verl spells differently (`ray_init.num_cpus` -> `trainer.ray_init.num_cpus`)."""
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


def unsupported_value_reason(key: str, value: Any) -> str | None:
    """For a key hyflow supports only at some values: why `value` is not one of them (None when it is)."""
    for pattern, (allowed, reason) in SUPPORTED_VALUES_ONLY.items():
        if value is not None and fnmatchcase(key, pattern) and value not in allowed:
            shown = ", ".join(repr(a) for a in allowed)
            return f"{key}={value!r} is not implemented by hyflow ({reason}). Fix: set {key} to one of: {shown}."
    return None
