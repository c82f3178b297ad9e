"""verl's side of `grpo_step.py`: the same GRPO step run by verl itself (`python -m verl.trainer.main_ppo`, its
default trainer, FSDP actor and vLLM rollout on the same GPU), timed by verl's own `timing_s/step` metric.

verl runs in a child process with its own packages: `--verl-path` is a `PYTHONPATH` (folders joined by `:`) that
holds verl's source and the versions it pins (transformers < 5.11, Ray, transfer_queue, codetiming, ...: built by
`benchmarks/peers/pack_verl.sh`, unpacked by `unpack_verl.sh`; vLLM 0.25.0 unpacked from ../shared/peers; no TRL,
whose 1.16 lacks the value-head class verl imports when TRL is importable), so hyflow's side keeps the machine's
packages. The child reads the same
random-weight model, tokenizer, parquet prompts and reward function (`grpo_step.compute_score`) as the other sides,
and is configured like them: GRPO, beta = 0 (no reference model, no KL loss), one optimizer step per batch
(`ppo_mini_batch_size` = prompts), responses of exactly `--response-length` tokens (`rollout.ignore_eos`), sampling
at temperature 1, micro-batches of `--micro-batch-size`, no gradient checkpointing, AdamW lr 1e-6 / weight decay
0.01, no validation and no checkpoint. What verl does its own way is kept as a verl user gets it: it recomputes the
old log-probs in a forward pass of their own (`old_log_prob`), keeps its actor weights as configured by default,
and syncs weights into vLLM through its checkpoint engine.

Each step's `timing_s/*` values are read from verl's console logger lines (`step:N - key:value - ...`, printed by its
Ray task runner, so prefixed with `(TaskRunner pid=...)`).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

STEP_LINE = re.compile(r"(?:^|\) )step:(\d+) - (.*)$")  # Ray prefixes "(TaskRunner pid=N) "
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours that prefix on a terminal-less run too


def verl_overrides(args: argparse.Namespace, assets: dict[str, Any], root: Path, reward_file: Path) -> list[str]:
    """verl 0.9 keys for `grpo_step.py`'s step (see the module docstring)."""
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={assets['train']}",
        f"data.val_files={assets['train']}",
        f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={args.prompt_length}",
        f"data.max_response_length={args.response_length}",
        "data.shuffle=False",
        "data.filter_overlong_prompts=False",
        "data.truncation=error",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={assets['model']}",
        f"actor_rollout_ref.model.tokenizer_path={assets['tokenizer']}",
        # FlashAttention 2's package is not on the GPU machine (no wheel for torch 2.11 + CUDA 13), and verl's
        # remove-padding path imports its `bert_padding`; SDPA on padded rows instead. Every prompt here has
        # exactly `--prompt-length` tokens and every response `--response-length`, so no row carries padding.
        "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch_size}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.optim.weight_decay=0.01",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.ignore_eos=True",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.verl_gpu_memory_utilization}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.log_prob_micro_batch_size}",
        f"reward.custom_reward_function.path={reward_file}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.logger=[console]",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.project_name=bench",
        "trainer.experiment_name=grpo_step_verl",
        f"trainer.default_local_dir={root / 'verl_ckpt'}",
        # verl 0.9 starts ~10 one-CPU Ray actors before its workers (the task runner, transfer_queue's controller and
        # 8 storage units); fewer logical CPUs leave its placement group waiting for ever
        "ray_kwargs.ray_init.num_cpus=64",
    ]


def parse_step_lines(lines: list[str]) -> list[dict[str, float]]:
    """verl's console logger lines → one dict per step of its numeric metrics, in step order."""
    steps: dict[int, dict[str, float]] = {}
    for line in lines:
        match = STEP_LINE.search(ANSI_ESCAPE.sub("", line).strip())
        if not match:
            continue
        metrics = {}
        for item in match.group(2).split(" - "):
            key, _, value = item.partition(":")
            try:
                metrics[key] = float(value)
            except ValueError:
                continue
        steps[int(match.group(1))] = metrics
    return [steps[step] for step in sorted(steps)]


def run_verl(args: argparse.Namespace, assets: dict[str, Any], root: Path) -> dict[str, Any]:
    """Run verl's trainer for `--steps` steps in a child process; returns each step's seconds and verl's stages."""
    reward_file = Path(__file__).resolve().with_name("grpo_step.py")
    env = {**os.environ, "PYTHONPATH": args.verl_path, "HYDRA_FULL_ERROR": "1", "RAY_DEDUP_LOGS": "0"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *verl_overrides(args, assets, root, reward_file)]
    log_file = root / "verl.log"
    with log_file.open("w") as log:  # its own process group: a timeout stops Ray's processes with it
        child = subprocess.Popen(
            command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode = child.wait(timeout=args.verl_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            returncode = f"none: stopped after --verl-timeout={args.verl_timeout} s"
            child.wait()
    lines = log_file.read_text(errors="replace").splitlines()
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "verl_grpo_step.log").write_text("\n".join(lines[-4000:]) + "\n")
    return verl_result(parse_step_lines(lines), returncode, args, lines)


def verl_result(logged: list[dict[str, float]], returncode: int | str, args: argparse.Namespace, lines: list[str]):
    """Each step's seconds and verl's stages from the steps it logged. A run that `--verl-timeout` stopped after
    at least two steps (the warm-up and one measured) keeps them, with a `stopped` note saying how many of
    `--steps` ran; any other early end, or an exit code other than 0, raises with the log's tail."""
    timed_out = isinstance(returncode, str)
    complete = returncode == 0 and len(logged) >= args.steps
    if not complete and not (timed_out and len(logged) >= 2):
        tail = "\n".join(lines[-40:])
        raise RuntimeError(
            f"verl's trainer exited with code {returncode} after {len(logged)} of {args.steps} steps; "
            f"last lines of its log:\n{tail}"
        )
    stages = [
        {key.removeprefix("timing_s/"): value for key, value in metrics.items() if key.startswith("timing_s/")}
        for metrics in logged
    ]
    result: dict[str, Any] = {"step_s": [timing["step"] for timing in stages], "verl_stages_s": stages}
    if not complete:
        result["stopped"] = (
            f"{len(logged)} of {args.steps} steps: stopped after --verl-timeout={args.verl_timeout} s "
            "(raise it for all of them)"
        )
    return result
