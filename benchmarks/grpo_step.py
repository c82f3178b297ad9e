"""One GRPO step: hyflow's `PPOTrainer` (local backend) against TRL's `GRPOTrainer`, with vLLM colocated and
without it, same run.

    python benchmarks/grpo_step.py                # CUDA: Qwen2-0.5B shape, 8 prompts x 8 samples, 64 -> 256 tokens
    python benchmarks/grpo_step.py --tiny         # CPU: a tiny model and small shapes (a smoke test, ~15 s)
    python benchmarks/grpo_step.py --only hyflow  # one side only (also: --only trl, --only trl-vllm)
    python benchmarks/grpo_step.py --only hyflow,trl-vllm  # two sides
    python benchmarks/grpo_step.py --shape 7b --master-dtype bf16 --micro-batch-size 8 --only hyflow,trl-vllm
    python benchmarks/grpo_step.py --backend ray --gpus 2   # hyflow alone on 2 Ray workers, one per GPU
    python benchmarks/grpo_step.py --backend ray --gpus 8 --shape 7b --master-dtype bf16 --prompts 64   # 8 engines
    python benchmarks/grpo_step.py --backend ray --gpus 8 --shape 32b --tp 8 --master-dtype bf16 --micro-batch-size 4
    python benchmarks/grpo_step.py --tiny --backend ray --gpus 2 --tp 2 --steps 2   # CPU: 2 Ray workers, one engine

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

Printed: a table of step 1 (warm-up) and the mean of steps 2..N for every side, hyflow's stages, the ratios
TRL / hyflow and TRL+vLLM / hyflow, and one JSON line with all of it; the JSON is also written to
`$OUT/grpo_step.json` when `$OUT` is set.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import logging
import os
import random
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

SPECIAL_TOKENS = ["<pad>", "<unk>", "<bos>", "<eos>"]  # the last four ids of the vocabulary
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"  # the prompt text, as is
TRAINING = {"learning_rate": 1e-6, "weight_decay": 0.01}  # hyflow's AdamW defaults, given to TRL too
STAGE_ORDER = ["gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"]
SIDES = {"hyflow": "hyflow", "trl": "TRL", "trl_vllm": "TRL+vLLM", "verl": "verl"}  # result key -> column, in order

logger = logging.getLogger("grpo_step")


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The reward of both sides (hyflow loads this file as its `custom_reward_function`): response characters / 1000."""
    return len(solution_str) / 1000.0


def trl_length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """`compute_score` in TRL's reward-function signature."""
    return [compute_score("bench", completion, None) for completion in completions]


def parse_args() -> argparse.Namespace:
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
        "--keep-kv-cache", action="store_true", help="rollout.free_cache_engine=False (the KV cache stays allocated)"
    )
    parser.add_argument("--backend", choices=["local", "ray"], default="local", help="hyflow's trainer.backend")
    parser.add_argument("--gpus", type=int, default=1, help="hyflow's workers (trainer.n_gpus_per_node), Ray only")
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of hyflow's steps 2..N (the host's side, by function)"
    )
    args = parser.parse_args()
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
    if "verl" in args.sides and not args.verl_path:
        parser.error("--only ...,verl needs --verl-path (a PYTHONPATH holding verl and its pinned packages)")
    if args.tiny:
        args.prompts, args.n, args.prompt_length, args.response_length = 4, 4, 16, 32
        args.micro_batch_size, args.log_prob_micro_batch_size = 8, 16
    if args.steps < 2:
        parser.error(f"--steps={args.steps}: need at least 2 (step 1 is warm-up, the mean is over steps 2..N)")
    if (args.prompts * args.n) % args.micro_batch_size:
        parser.error(
            f"--micro-batch-size={args.micro_batch_size} must divide the {args.prompts * args.n} sequences of a step "
            "(--prompts x --n): TRL accumulates whole micro-batches into its one optimizer step"
        )
    return args


def model_config(shape: str) -> Qwen2Config:
    """A shape of `shapes.SHAPES` (Qwen2-0.5B's by default; `tiny`: ~100K parameters); specials are the last ids."""
    from shapes import SHAPES  # here, not at the top: hyflow loads this file by path for `compute_score`

    sizes = {"rope_theta": 1000000.0, **SHAPES[shape]}
    vocab_size = int(sizes["vocab_size"])
    config = Qwen2Config(
        **sizes, max_position_embeddings=4096,
        pad_token_id=vocab_size - 4, bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1,
    )  # fmt: skip
    config.architectures = ["Qwen2ForCausalLM"]
    return config


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer with one word `t<id>` per id, so any id sequence decodes and re-encodes exactly."""
    vocab = {f"t{i}": i for i in range(vocab_size - len(SPECIAL_TOKENS))}
    vocab.update({token: vocab_size - len(SPECIAL_TOKENS) + j for j, token in enumerate(SPECIAL_TOKENS)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    pad, unk, bos, eos = SPECIAL_TOKENS
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=pad, unk_token=unk, bos_token=bos, eos_token=eos, padding_side="left"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_assets(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Save the random model (bf16 on the GPU run, fp32 for `--tiny`) under `root/model`, its tokenizer under
    `root/tokenizer`, and `--steps` batches of random prompts as verl-schema parquet; returns the paths and the
    prompt texts.

    The tokenizer has a folder of its own because transformers 5 loads a tokenizer that sits next to a qwen2
    config.json as `Qwen2Tokenizer` (a BPE), whatever class tokenizer_config.json names, and a WordLevel vocabulary
    read as BPE encodes every prompt to nothing."""
    from hyflow.models.tiny import save_tokenizer

    config = model_config("tiny" if args.tiny else args.shape)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    with torch.device(device):  # a 7B model's random init on the host takes minutes
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32 if args.tiny else torch.bfloat16)
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    tokenizer_dir = root / "tokenizer"
    tokenizer = build_tokenizer(config.vocab_size)
    save_tokenizer(tokenizer, tokenizer_dir)
    # A copy beside the weights for TRL's colocated vLLM, which loads its tokenizer from the model folder: it reads
    # it as Qwen2Tokenizer too, which still turns ids into text, all vLLM does with it (prompts go in as ids).
    save_tokenizer(tokenizer, model_dir)
    num_params = sum(p.numel() for p in model.parameters())
    del model
    rng = random.Random(0)
    words = config.vocab_size - len(SPECIAL_TOKENS)
    num_prompts = args.prompts * args.steps  # one epoch: no prompt is used twice
    prompts = [" ".join(f"t{rng.randrange(words)}" for _ in range(args.prompt_length)) for _ in range(num_prompts)]
    rows = [
        {
            "data_source": "bench",
            "prompt": [{"role": "user", "content": text}],
            "ability": "bench",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"index": index},
        }
        for index, text in enumerate(prompts)
    ]
    train_file = root / "train.parquet"
    pd.DataFrame(rows).to_parquet(train_file)
    return {
        "model": str(model_dir), "tokenizer": str(tokenizer_dir), "train": str(train_file), "prompts": prompts,
        "num_params": num_params,
    }  # fmt: skip


def hyflow_overrides(args: argparse.Namespace, assets: dict[str, Any], root: Path) -> list[str]:
    """GRPO, beta = 0, one optimizer step per batch, local backend, no validation, no model checkpoint."""
    return [
        f"data.train_files={assets['train']}",
        f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={args.prompt_length}",
        f"data.max_response_length={args.response_length}",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={assets['model']}",
        f"actor_rollout_ref.model.tokenizer_path={assets['tokenizer']}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"actor_rollout_ref.actor.fsdp_config.model_dtype={args.master_dtype}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch_size}",
        f"actor_rollout_ref.actor.optim.lr={TRAINING['learning_rate']}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.checkpoint.save_contents=[]",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={args.tp}",
        f"actor_rollout_ref.rollout.free_cache_engine={not args.keep_kv_cache}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.ignore_eos=True",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.log_prob_micro_batch_size}",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"custom_reward_function.path={Path(__file__).resolve()}",
        "custom_reward_function.name=compute_score",
        f"trainer.backend={args.backend}",
        f"trainer.n_gpus_per_node={args.gpus}",
        f"trainer.ray_init.num_cpus={max(4, 2 * args.gpus)}",
        f"trainer.device={'cpu' if args.tiny else 'auto'}",
        *timed_run_overrides(args.steps, root, "grpo_step"),
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


@contextlib.contextmanager
def isolated_process_state(root: Path) -> Iterator[None]:
    """Run in `root` (the trackers write under ./logs) and give the environment back afterwards: the local backend
    sets RANK / WORLD_SIZE / MASTER_* here, which would make accelerate (TRL) think it runs distributed."""
    environ = dict(os.environ)
    try:
        with contextlib.chdir(root):
            yield
    finally:
        os.environ.clear()
        os.environ.update(environ)


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


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measured_side(run: Any, args: argparse.Namespace, assets: dict[str, Any], root: Path) -> dict[str, Any]:
    """Run one side and summarize it: step 1 apart (warm-up: compilation, CUDA graphs, allocator), the mean of
    steps 2..N, generated tokens/s; for hyflow each stage's mean over steps 2..N in pipeline order and `other` (the
    step minus its stages); on CUDA the side's peak memory and what stayed allocated once it was freed."""
    on_this_gpu = torch.cuda.is_available() and args.backend == "local"  # Ray workers' memory is theirs
    if on_this_gpu:
        torch.cuda.reset_peak_memory_stats()
    side = run(args, assets, root)
    free_memory()
    steps = side["step_s"]
    mean = statistics.fmean(steps[1:])
    generated_tokens = args.prompts * args.n * args.response_length
    summary = {"step_s": steps, "warmup_s": steps[0], "mean_s": mean, "min_s": min(steps[1:]), "max_s": max(steps[1:])}
    summary["generated_tokens_per_s"] = generated_tokens / mean
    summary["generated_tokens_per_s_per_gpu"] = generated_tokens / mean / args.gpus
    syncs = side.get("weight_sync", [])[1:]
    if any(syncs):  # the workers' mean per rank, steps 2..N
        names = sorted({name for sync in syncs for name in sync})
        summary["weight_sync_mean"] = {name: statistics.fmean(sync.get(name, 0.0) for sync in syncs) for name in names}
    if "stages_s" in side:
        later = side["stages_s"][1:]
        names = {name for timing in later for name in timing if name != "step"}
        names = sorted(names, key=lambda name: (STAGE_ORDER.index(name) if name in STAGE_ORDER else 99, name))
        stages = {name: statistics.fmean(t.get(name, 0.0) for t in later) for name in names}
        stages["other"] = mean - sum(seconds for name, seconds in stages.items() if "/" not in name)  # gen/*: parts
        summary.update(stages_mean_s=stages, stages_s=side["stages_s"], graph_captures=side["graph_captures"])
    if "verl_stages_s" in side:  # verl's own stage names (gen, old_log_prob, update_actor, update_weights, ...)
        later = side["verl_stages_s"][1:]
        names = sorted({name for timing in later for name in timing if name != "step"})
        summary["verl_stages_mean_s"] = {name: statistics.fmean(t.get(name, 0.0) for t in later) for name in names}
        summary["verl_stages_s"] = side["verl_stages_s"]
    if any(side.get("response_length_mean") or []):
        summary["response_length_mean"] = side["response_length_mean"]
    if on_this_gpu:
        summary["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        summary["memory_left_gib"] = torch.cuda.memory_allocated() / 2**30
    return summary


def run_trl_side(
    args: argparse.Namespace, assets: dict[str, Any], root: Path, result: dict[str, Any], side: str
) -> None:
    """One TRL side's numbers into `result[side]` (`trl`, or `trl_vllm`: vLLM colocated), or why there are none (not
    installed, or the run failed)."""
    # Imported here, not at the top: hyflow also loads this file by path for `compute_score`, where the folder of
    # this file is not on sys.path (it is when the file runs as a script).
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
    from grpo_step_verl import run_verl

    try:
        result["verl"] = measured_side(run_verl, args, assets, root)
    except Exception as exc:  # the peer failing must not lose the other sides' numbers of the same run
        logger.exception("the verl side failed")
        result["verl_error"] = f"{type(exc).__name__}: {exc}"


def main() -> None:
    from grpo_step_report import print_table, write_result  # here: hyflow loads this file by path (compute_score)

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
