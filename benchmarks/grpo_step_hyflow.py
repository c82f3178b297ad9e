"""hyflow's side of `grpo_step.py`: the step as a user runs it, `PPOTrainer.fit()` with key=value overrides, its
times read back from the `file` logger's `timing_s/*` metrics.

    side = run_hyflow(args, assets, root)          # {"step_s": [...], "stages_s": [...], "weight_sync": [...], ...}
    side = train_and_time(overrides, root)         # any overrides (vlm_grpo_step.py: its image prompts)

The overrides: GRPO, beta = 0, one optimizer step per batch, responses of exactly `--response-length` tokens
(`rollout.ignore_eos`), the reward `grpo_step.compute_score`, and `timed_run_overrides` (the steps and nothing else:
no validation, no model checkpoint, no resume). `--profile` runs steps 2..N under cProfile.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from grpo_step_measure import isolated_process_state

TRAINING = {"learning_rate": 1e-6, "weight_decay": 0.01}  # hyflow's AdamW defaults, given to TRL too
REWARD_FILE = Path(__file__).resolve().with_name("grpo_step.py")  # hyflow loads it by path for `compute_score`


def hyflow_overrides(args: argparse.Namespace, assets: dict[str, Any], root: Path) -> list[str]:
    """GRPO (beta = 0 and one optimizer step per batch unless --kl-loss-coef / --mini-batches say otherwise), the
    backend of --backend, no validation, no model checkpoint."""
    return [
        f"data.train_files={assets['train']}",
        f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={args.prompt_length}",
        f"data.max_response_length={args.response_length}",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={assets['model']}",
        f"actor_rollout_ref.model.tokenizer_path={assets['tokenizer']}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={args.gradient_checkpointing}",
        f"actor_rollout_ref.actor.fsdp_config.model_dtype={args.master_dtype}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts // args.mini_batches}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch_size}",
        f"actor_rollout_ref.actor.optim.lr={TRAINING['learning_rate']}",
        *kl_overrides(args.kl_loss_coef, args.log_prob_micro_batch_size),
        "actor_rollout_ref.actor.checkpoint.save_contents=[]",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={args.tp}",
        f"actor_rollout_ref.rollout.free_cache_engine={not args.keep_kv_cache}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.ignore_eos=True",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.log_prob_micro_batch_size}",
        *(
            [f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}"]
            if args.gpu_memory_utilization is not None
            else []
        ),
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"custom_reward_function.path={REWARD_FILE}",
        "custom_reward_function.name=compute_score",
        f"trainer.backend={args.backend}",
        f"trainer.n_gpus_per_node={args.gpus}",
        f"trainer.ray_init.num_cpus={ray_cpus(args)}",
        f"trainer.device={'cpu' if args.tiny else 'auto'}",
        *timed_run_overrides(args.steps, root, "grpo_step"),
    ]


def ray_cpus(args: argparse.Namespace) -> int:
    """Ray's logical CPUs for `--backend ray`: the machine's cores, and at least one a GPU (a GPU bundle of a Ray pool
    holds one CPU, hyflow.controller.ray_pool; fewer and the pool waits for them and fails); a CPU bundle (`--tiny`)
    holds 0.1."""
    return 4 if args.tiny else max(os.cpu_count() or 1, args.gpus)


def kl_overrides(coef: float, micro_batch_size: int) -> list[str]:
    """β = 0: no reference policy; β > 0: the k3 KL to it as a loss term (NeMo-RL's default: k3, 0.01), the frozen
    reference in bf16, its log-prob pass in micro-batches of `micro_batch_size`."""
    if not coef:
        return ["actor_rollout_ref.actor.use_kl_loss=False"]
    return [
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"actor_rollout_ref.actor.kl_loss_coef={coef}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro_batch_size}",
    ]


def timed_run_overrides(steps: int, root: Path, experiment: str) -> list[str]:
    """`steps` steps and nothing else: no validation, no checkpoint, no resume, metrics to the `file` logger."""
    return [
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=[file]",
        "trainer.project_name=bench",
        f"trainer.experiment_name={experiment}",
        f"trainer.default_local_dir={root / 'ckpt'}",
    ]


def profile_steps_after_first(trainer: Any) -> None:
    """Runs the generation (`_rollout`) and the rest (`train_step`) of every step after the first under cProfile;
    the tables (by own time, then cumulative) print when the trainer closes."""
    import cProfile
    import pstats

    host_profile, close = cProfile.Profile(), trainer.close

    def profiled(method: Any) -> Any:
        calls = [0]

        def wrapper(*method_args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1:
                return method(*method_args, **kwargs)
            with host_profile:
                return method(*method_args, **kwargs)

        return wrapper

    def close_and_print() -> None:
        close()
        pstats.Stats(host_profile).sort_stats("tottime").print_stats(30)
        pstats.Stats(host_profile).sort_stats("cumulative").print_stats(60)

    trainer._rollout, trainer.train_step = profiled(trainer._rollout), profiled(trainer.train_step)
    trainer.close = close_and_print


def run_hyflow(args: argparse.Namespace, assets: dict[str, Any], root: Path) -> dict[str, Any]:
    """Train `--steps` GRPO steps with `PPOTrainer.fit()`; returns each step's seconds and `timing_s/*` stages."""
    return train_and_time(hyflow_overrides(args, assets, root), root, profile=args.profile)


def train_and_time(overrides: list[str], root: Path, profile: bool = False) -> dict[str, Any]:
    """`PPOTrainer.fit()` with `overrides` (a `file` logger among them) in `root`; each step's seconds, its
    `timing_s/*` stages, CUDA-graph captures and logged mean response length, read back from the file logger."""
    from hyflow.config import load_config
    from hyflow.trainer.ppo_trainer import PPOTrainer

    with isolated_process_state(root):
        trainer = PPOTrainer(load_config(overrides))
        if profile:
            profile_steps_after_first(trainer)
        try:
            trainer.init_workers()
            trainer.fit()
        finally:
            trainer.close()
        with (trainer.tracking.log_dir / "metrics.jsonl").open() as f:
            logged = [json.loads(line)["data"] for line in f]
    stages = []
    for metrics in logged:
        timing = {key.removeprefix("timing_s/"): value for key, value in metrics.items() if key.startswith("timing_s/")}
        timing["step"] -= timing.pop("save_checkpoint", 0.0)  # the end-of-run checkpoint is not part of a step
        stages.append(timing)
    captures = [metrics.get("rollout/cuda_graph_captures", 0) for metrics in logged]
    syncs = [{k: v for k, v in metrics.items() if k.startswith("rollout/weight_sync")} for metrics in logged]
    lengths = [metrics.get("response_length/mean") for metrics in logged]
    return {
        "step_s": [timing["step"] for timing in stages], "stages_s": stages, "graph_captures": captures,
        "response_length_mean": lengths, "weight_sync": syncs,
    }  # fmt: skip
