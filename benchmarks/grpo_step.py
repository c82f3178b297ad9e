"""One GRPO step: hyflow's `PPOTrainer` (local backend) against TRL's `GRPOTrainer`, with vLLM colocated and
without it, same run.

    python benchmarks/grpo_step.py                # CUDA: Qwen2-0.5B shape, 8 prompts x 8 samples, 64 -> 256 tokens
    python benchmarks/grpo_step.py --tiny         # CPU: a tiny model and small shapes (a smoke test, ~15 s)
    python benchmarks/grpo_step.py --only hyflow  # one side only (also: --only trl, --only trl-vllm)
    python benchmarks/grpo_step.py --only hyflow,trl-vllm  # two sides
    python benchmarks/grpo_step.py --shape 7b --master-dtype bf16 --micro-batch-size 8 --only hyflow,trl-vllm
    python benchmarks/grpo_step.py --backend ray --gpus 2 --prompts 16   # hyflow alone on 2 Ray workers, one a GPU
    python benchmarks/grpo_step.py --backend ray --gpus 8 --shape 7b --master-dtype bf16 --prompts 64   # 8 engines
    python benchmarks/grpo_step.py --backend ray --gpus 8 --shape 32b --tp 8 --master-dtype bf16 --micro-batch-size 4
    python benchmarks/grpo_step.py --tiny --backend ray --gpus 2 --tp 2 --steps 2   # CPU: 2 Ray workers, one engine
    python benchmarks/grpo_step.py --only hyflow --shape 7b --master-dtype bf16 --prompts 4 --n 32 --prompt-length 128 \
        --response-length 1024 --mini-batches 4 --kl-loss-coef 0.01 --micro-batch-size 2 --log-prob-micro-batch-size 4
    python benchmarks/grpo_step.py --tiny --only hyflow --mini-batches 2 --kl-loss-coef 0.01 --steps 2   # CPU

Both sides train the same random-weight model (saved once to a temp folder with a WordLevel tokenizer over the
whole vocabulary, so random token ids decode to text) on the same random prompts:

- `--prompts` prompts x `--n` samples per step, prompts of exactly `--prompt-length` tokens, responses of exactly
  `--response-length` tokens (hyflow: `rollout.ignore_eos`; TRL: `min_new_tokens`), sampling at temperature 1;
- GRPO advantages, beta = 0 (no reference model, no KL), one optimizer step per generation batch (the mini-batch
  is the whole batch), no gradient checkpointing, AdamW (lr 1e-6, weight decay 0.01, constant);
- the same reward, `compute_score` below: the length of the decoded response in characters / 1000.

Where the sides differ by design: hyflow keeps fp32 master weights and computes in bf16 (FSDP2 mixed precision),
TRL trains the bf16 model as loaded (as the measured TRL baseline did). Neither side runs a forward pass for the
old log-probs: with one optimizer step per batch both take them from the update's own forward (hyflow:
`actor.recompute_old_log_prob=auto`, so its stage table has no `old_log_prob`); both run the 64 sequences as one
micro-batch (hyflow: `--micro-batch-size`, default 64).

hyflow runs `PPOTrainer.fit()` for `--steps` steps and reads each step's `timing_s/*` metrics from its `file`
logger (the checkpoint it writes after the last step holds no model or optimizer state here, and its time is
taken out of that step). TRL's sides are in `grpo_step_trl.py`; its step times come from a callback around each
optimizer step. TRL's two sides: `trl` generates with `transformers.generate`, `trl-vllm` with vLLM colocated in
the same process (`use_vllm=True, vllm_mode="colocate"`, TRL's defaults otherwise); it runs last, as the vLLM
engine it starts stays in the process. A TRL side is skipped with a message when TRL (or, for `trl-vllm`, vLLM) is
not importable (`pip install trl==1.16.0`; vLLM: ../shared/peers).

With `--backend ray --gpus N` hyflow alone runs the same step on N Ray workers (one process per GPU, actor, rollout
engine and reference colocated in each, FSDP2 over NCCL, the prompts balanced over the engines); its JSON goes to
`$OUT/grpo_step_ray_<N>gpu.json`. Set beside a one-GPU run of the same shape to read the scaling: the table then
gives generated tokens/s per GPU and the weight sync's seconds and bytes per rank. `--tp T` splits each engine
over T workers (`rollout.tensor_model_parallel_size`; N / T engines, each TP rank receiving only its weight slices).

NeMo-RL's anchor (issue #23): its performance summary reports GRPO on Llama-3.1-8B-Instruct, 16 H100s, 64 prompts
x 32 generations = 2,048 samples a step (128 a GPU), ~1,020 generated tokens (up to 4,096), a training batch of 512
(4 optimizer steps a step), the k3 KL to a reference at 0.01 (so a reference and an old-log-prob pass): 1,581
"Tokens/sec/GPU" on-policy, 2,478 one-step off-policy (v0.5). Its tokens/s/GPU counts every sample's prompt +
response tokens over the whole step's time (generation, log-probs, refit, training), over all GPUs of the run
(`nemo_rl/algorithms/utils.py`). The row `total tok/s/GPU (NeMo-RL)` is that measure: prompts x n x (prompt +
response tokens) / mean step / GPUs. The 7B command above is that shape per GPU (benchmarks/suite_step.sh's
NEMO_RL_SHAPE; `--prompts 4 x GPUs` on the Ray backend). `--mini-batches`, `--kl-loss-coef`,
`--gradient-checkpointing` and `--gpu-memory-utilization` change hyflow's side only.

Printed: a table of step 1 (warm-up) and the mean of steps 2..N for every side, hyflow's stages, the ratios
TRL / hyflow and TRL+vLLM / hyflow, and one JSON line with all of it; the JSON is also written to
`$OUT/grpo_step.json` when `$OUT` is set.

The parts: the model, tokenizer and prompts every side trains on in `grpo_step_assets.py`, hyflow's side in
`grpo_step_hyflow.py`, TRL's in `grpo_step_trl.py`, verl's in `grpo_step_verl.py`, how a side is run and summarized
in `grpo_step_measure.py`, the table and the JSON in `grpo_step_report.py`. This file is the command line, the
reward, and the order of the sides.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers

SIDES = {"hyflow": "hyflow", "trl": "TRL", "trl_vllm": "TRL+vLLM", "verl": "verl"}  # result key -> column, in order

logger = logging.getLogger("grpo_step")


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The reward of both sides (hyflow loads this file as its `custom_reward_function`): response characters / 1000."""
    return len(solution_str) / 1000.0


def trl_length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """`compute_score` in TRL's reward-function signature."""
    return [compute_score("bench", completion, None) for completion in completions]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return check_args(build_parser(), argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny model and small shapes on CPU (smoke test)")
    parser.add_argument(
        "--only", default=None,
        help="comma-separated sides to run, of hyflow, trl, trl-vllm, verl (default: the first three)",
    )  # fmt: skip
    parser.add_argument(
        "--verl-path", default=None,
        help="verl's side: a PYTHONPATH with verl's source, its pinned packages and vLLM (see grpo_step_verl.py)",
    )  # fmt: skip
    parser.add_argument("--verl-gpu-memory-utilization", type=float, default=0.5, help="verl's vLLM memory share")
    parser.add_argument("--verl-timeout", type=float, default=400, help="seconds verl's whole run may take")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps per side; step 1 is reported as warm-up")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt (rollout.n / num_generations)")
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--response-length", type=int, default=256)
    parser.add_argument("--shape", choices=["0.5b", "1.5b", "7b", "32b"], default="0.5b", help="the GPU model's shape")
    parser.add_argument("--tp", type=int, default=1, help="workers per engine (rollout.tensor_model_parallel_size)")
    parser.add_argument(
        "--micro-batch-size", type=int, default=64, help="the update micro-batch of both sides (sequences)"
    )
    parser.add_argument(
        "--master-dtype", choices=["fp32", "bf16"], default="fp32",
        help="hyflow's master weights (bf16: as TRL trains; a 7B model's fp32 weights and AdamW state fill an H200)",
    )  # fmt: skip
    parser.add_argument("--log-prob-micro-batch-size", type=int, default=64, help="hyflow's old-log-prob micro-batch")
    parser.add_argument(
        "--mini-batches", type=int, default=1,
        help="hyflow: optimizer steps per batch (ppo_mini_batch_size = prompts / this; > 1 adds the old-log-prob pass)",
    )  # fmt: skip
    parser.add_argument(
        "--kl-loss-coef", type=float, default=0.0,
        help="hyflow: > 0 adds the reference policy and its log-prob pass (k3 KL loss, as NeMo-RL's default 0.01)",
    )  # fmt: skip
    parser.add_argument("--gradient-checkpointing", action="store_true", help="hyflow: recompute activations")
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=None, help="hyflow: the engine's KV cache share (0.5)"
    )
    parser.add_argument(
        "--keep-kv-cache", action="store_true", help="rollout.free_cache_engine=False (the KV cache stays allocated)"
    )
    parser.add_argument("--backend", choices=["local", "ray"], default="local", help="hyflow's trainer.backend")
    parser.add_argument("--gpus", type=int, default=1, help="hyflow's workers (trainer.n_gpus_per_node), Ray only")
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of hyflow's steps 2..N (the host's side, by function)"
    )
    return parser


def check_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse `argv` and stop with a clear message on combinations that cannot run."""
    args = parser.parse_args(argv)
    if args.backend == "local" and args.gpus != 1:
        parser.error(f"--gpus={args.gpus} needs --backend ray (the local backend runs one process)")
    if args.gpus % args.tp:
        parser.error(f"--tp={args.tp} must divide --gpus={args.gpus} (each engine spans --tp workers)")
    if args.backend == "ray":
        args.only = "hyflow"  # TRL's side is one process; compare it with a one-GPU run
    args.sides = [side.replace("-", "_") for side in (args.only or "hyflow,trl,trl-vllm").split(",")]
    unknown = [side for side in args.sides if side not in SIDES]
    if unknown:
        parser.error(f"--only={args.only}: unknown side(s) {unknown}; choose from hyflow, trl, trl-vllm, verl")
    hyflow_only = [
        flag for flag, on in (("--mini-batches", args.mini_batches != 1), ("--kl-loss-coef", args.kl_loss_coef)) if on
    ]
    if hyflow_only and args.sides != ["hyflow"]:
        parser.error(
            f"{' and '.join(hyflow_only)} change hyflow's step only (the other sides would run another step). "
            "Fix: add --only hyflow."
        )
    if "verl" in args.sides and not args.verl_path:
        parser.error("--only ...,verl needs --verl-path (a PYTHONPATH holding verl and its pinned packages)")
    if args.tiny:
        args.prompts, args.n, args.prompt_length, args.response_length = 4, 4, 16, 32
        args.micro_batch_size, args.log_prob_micro_batch_size = 8, 16
    if args.steps < 2:
        parser.error(f"--steps={args.steps}: need at least 2 (step 1 is warm-up, the mean is over steps 2..N)")
    if args.mini_batches < 1 or args.prompts % args.mini_batches:
        parser.error(f"--mini-batches={args.mini_batches} must divide --prompts={args.prompts} (whole mini-batches)")
    rows_per_gpu = args.prompts // args.mini_batches * args.n / args.gpus  # of one mini-batch, on each worker
    if rows_per_gpu % args.micro_batch_size:
        parser.error(
            f"--micro-batch-size={args.micro_batch_size} must divide each GPU's {rows_per_gpu:g} rows of a mini-batch "
            "(--prompts / --mini-batches x --n / --gpus). Fix: pick sizes that divide."
        )
    if (args.prompts * args.n) % args.micro_batch_size:
        parser.error(
            f"--micro-batch-size={args.micro_batch_size} must divide the {args.prompts * args.n} sequences of a step "
            "(--prompts x --n): TRL accumulates whole micro-batches into its one optimizer step"
        )
    return args


def run_trl_side(
    args: argparse.Namespace, assets: dict[str, Any], root: Path, result: dict[str, Any], side: str
) -> None:
    """One TRL side's numbers into `result[side]` (`trl`, or `trl_vllm`: vLLM colocated), or why there are none (not
    installed, or the run failed)."""
    # Imported here, not at the top: hyflow also loads this file by path for `compute_score`, where the folder of
    # this file is not on sys.path (it is when the file runs as a script).
    from grpo_step_hyflow import TRAINING
    from grpo_step_measure import free_memory, isolated_process_state, measured_side
    from grpo_step_trl import run_trl, trl_missing

    use_vllm = side == "trl_vllm"
    reason = trl_missing(use_vllm)
    if reason is not None:
        result[f"{side}_skipped"] = reason
        return
    import trl

    result["trl_version"] = trl.__version__
    if use_vllm:
        import vllm

        result["vllm_version"] = vllm.__version__
    try:
        run = functools.partial(run_trl, reward_fn=trl_length_reward, hyperparameters=TRAINING, use_vllm=use_vllm)
        with isolated_process_state(root):  # colocated vLLM sets RANK / WORLD_SIZE / MASTER_* for itself
            result[side] = measured_side(run, args, assets, root)
    except Exception as exc:  # the baseline failing must not lose hyflow's numbers of the same run
        logger.exception("the %s side failed", SIDES[side])
        result[f"{side}_error"] = f"{type(exc).__name__}: {exc}"
    free_memory()  # a failed run's objects, now that the exception that held them is gone


def run_verl_side(args: argparse.Namespace, assets: dict[str, Any], root: Path, result: dict[str, Any]) -> None:
    """verl's numbers into `result["verl"]`, or why there are none (its child process failed: the log's tail)."""
    from grpo_step_measure import measured_side
    from grpo_step_verl import run_verl

    try:
        result["verl"] = measured_side(run_verl, args, assets, root)
    except Exception as exc:  # the peer failing must not lose the other sides' numbers of the same run
        logger.exception("the verl side failed")
        result["verl_error"] = f"{type(exc).__name__}: {exc}"


def main() -> None:
    # here, not at the top: hyflow loads this file by path (compute_score)
    from grpo_step_assets import build_assets
    from grpo_step_hyflow import run_hyflow
    from grpo_step_measure import measured_side
    from grpo_step_report import print_table, write_result

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_DISABLED", "true")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is not in ../shared/peers' vLLM build
    args = parse_args()
    device = "cpu" if args.tiny or not torch.cuda.is_available() else torch.cuda.get_device_name()
    result: dict[str, Any] = {"device": device, "torch": torch.__version__, "transformers": transformers.__version__}
    result.update(backend=args.backend, gpus=args.gpus)
    with tempfile.TemporaryDirectory(prefix="hyflow_grpo_step_") as tmp:
        root = Path(tmp)
        assets = build_assets(root, args)
        result["shape"] = {
            "num_params": assets["num_params"], "prompts": args.prompts, "n": args.n, "steps": args.steps,
            "prompt_length": args.prompt_length, "response_length": args.response_length,
            "generated_tokens": args.prompts * args.n * args.response_length,
            "total_tokens": args.prompts * args.n * (args.prompt_length + args.response_length),
            "mini_batches": args.mini_batches, "kl_loss_coef": args.kl_loss_coef,
            "micro_batch_size": args.micro_batch_size, "log_prob_micro_batch_size": args.log_prob_micro_batch_size,
            "shape": "tiny" if args.tiny else args.shape, "hyflow_master_dtype": args.master_dtype, "tp": args.tp,
        }  # fmt: skip
        if "hyflow" in args.sides:
            result["hyflow"] = measured_side(run_hyflow, args, assets, root)
            write_result(result, echo=False)
        if "verl" in args.sides:  # a child process: before TRL+vLLM, whose engine stays in this process
            run_verl_side(args, assets, root, result)
            write_result(result, echo=False)
        for side in ("trl", "trl_vllm"):
            if side in args.sides:
                run_trl_side(args, assets, root, result, side)
                write_result(result, echo=False)
    for side in ("trl", "trl_vllm", "verl"):
        if "hyflow" in result and side in result:
            result[f"ratio_{side}_over_hyflow"] = result[side]["mean_s"] / result["hyflow"]["mean_s"]
    print_table(result, SIDES)
    write_result(result)


if __name__ == "__main__":
    main()
