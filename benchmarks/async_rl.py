"""Tokens per second of synchronous against asynchronous GRPO, same run, same prompts and seed: the usual
colocated run on N devices beside split placement (`trainer.placement=split`) on the same N, K training and N - K
rollout Ray workers; a random model, the synthetic arithmetic task; on the CPU by default, on GPUs with
`--device cuda`.

    python benchmarks/async_rl.py                          # 8 steps of each mode, CPU, a tiny model
    python benchmarks/async_rl.py --steps 4 --modes colocated,sync,one_step_off --hidden-size 64
    python benchmarks/async_rl.py --gpus 4 --steps 3 --modes colocated,sync   # CPU: 4 workers, 2 + 2 when split
    python benchmarks/async_rl.py --device cuda            # one GPU: Qwen2-0.5B's shape, 64 x 8 samples of 256
    python benchmarks/async_rl.py --device cuda --gpus 2   # the rollout worker on a second GPU (NCCL weights)
    python benchmarks/async_rl.py --device cuda --gpus 8   # colocated on 8 GPUs beside 4 training + 4 rollout
    python benchmarks/async_rl.py --device cuda --gpus 8 --train-gpus 2 --modes sync,one_step_off
    python benchmarks/async_rl.py --tool-delay-s 2 --modes sync,async1   # agent loops, every 8th tool call slow

Pools (`--gpus N`, devices: CPU worker processes with `--device cpu`): `colocated` runs every role on all N
(`trainer.n_gpus_per_node=N`: actor, engine and reference in each process, the prompts split over N engines);
the split modes give training `--train-gpus K` workers (default N / 2: FSDP2 over K) and generation the other
N - K (`trainer.rollout_n_gpus_per_node`: one engine each, the prompts split over them); training rank 0 sends the
weights to every rollout worker over the weight channel (hyflow.workers.pool_transfer). With N = 1 the split modes
run 1 + 1 workers: on the CPU as two processes, on one GPU (`--device cuda`) the rollout worker beside the training
worker on the same device (`trainer.rollout_shares_devices`): generation and updates overlap by sharing it, the
weights cross through CUDA IPC (hyflow.workers.ipc_transfer; gloo and host memory with
`HYFLOW_WEIGHT_CHANNEL_IPC=0`). With a GPU each the weights go device to device over NCCL. Every engine's KV cache
takes `--gpu-memory-utilization` of its device. The model has Qwen2-0.5B's layers (`--shape 0.5b`, the default on
cuda; `--shape 7b` with `--master-dtype bf16` where K GPUs cannot hold fp32 AdamW) with the tiny tokenizer's
vocabulary, so the arithmetic task's prompts stay valid; the batch defaults grow to 64 prompts x 8 samples of 256,
and fully async requests to 256 rows an engine (`async_training.chunk_prompts=0`, auto).

`--tool-delay-s D` turns every sample into two turns around a tool call, and every `--slow-every`-th tool call
takes D seconds: in `sync` each step waits for its slowest sample, in `fully_async` each prompt group is scheduled
on its own (hyflow.trainer.agent_groups), so the trainer takes the groups that are done (one_step_off, too, waits
for whole batches).

Modes: `colocated` (every role in every worker: the usual synchronous hybrid engine), `sync` (split placement,
generate then train: the two pools take turns), `one_step_off` and `async1` / `async4` (fully async with
`max_staleness` 1 / 4), all on the same prompts and seed. Responses have a fixed length (`rollout.ignore_eos`), so
every step moves the same number of tokens and only the overlap differs.

Per mode, over steps 2..N (step 1 warms up): tokens per second of wall time (the batch's prompt and response tokens,
`perf/total_num_tokens`, over `timing_s/step`, which for the asynchronous modes starts when the trainer begins
waiting for its batch, so consecutive steps tile the wall clock), as the mean ± standard deviation and the min..max
of the per-step values; tokens per second per device (over all N: NeMo-RL's end-to-end tokens/s/GPU, which divides
by every GPU of the run, generation's included); the ratio to `colocated` and to `sync`; the trainer's and the
rollout pool's idle fractions, and the weight transfer's time. One JSON line follows (also `$OUT/async_rl.json`, or
`$OUT/async_rl_<N>gpu.json` for N > 1, when `$OUT` is set). The CPU is whatever the machine has: on a shared one the
spread says how far to trust the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from shapes import SHAPES  # this script's folder

MODES = {
    "colocated": ["trainer.placement=colocated"],
    "sync": ["trainer.placement=split", "async_training.mode=sync"],
    "one_step_off": ["trainer.placement=split", "async_training.mode=one_step_off"],
    "async1": ["trainer.placement=split", "async_training.mode=fully_async", "async_training.max_staleness=1"],
    "async4": ["trainer.placement=split", "async_training.mode=fully_async", "async_training.max_staleness=4"],
}


def train(overrides: list[str], out: Path) -> list[dict]:
    """Run `PPOTrainer.fit()` with `overrides` in `out`; returns the file logger's lines ({"step", "data"})."""
    from hyflow.config import load_config
    from hyflow.trainer.ppo_trainer import PPOTrainer

    config = load_config([*overrides, "trainer.logger=[file]", f"trainer.default_local_dir={out / 'ckpt'}"])
    with contextlib.chdir(out):
        trainer = PPOTrainer(config)
        trainer.init_workers()
        try:
            trainer.fit()
        finally:
            trainer.close()
        with (trainer.tracking.log_dir / "metrics.jsonl").open() as lines:
            return [json.loads(line) for line in lines]


LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
# what --prompts, --n, ... default to on each device (micro_batch_size 0: the whole step in one micro-batch)
DEFAULTS = {
    "cpu": dict(prompts=16, n=4, response_length=32, chunk_prompts=4, shape=None, micro_batch_size=0),
    "cuda": dict(prompts=64, n=8, response_length=256, chunk_prompts=0, shape="0.5b", micro_batch_size=64),
}


def assets(root: Path, args: argparse.Namespace) -> dict[str, str]:
    from hyflow.data.prepare import prepare_task
    from hyflow.models.tiny import build_tiny_model

    hidden = args.hidden_size
    sizes = {"hidden_size": hidden, "num_layers": args.num_layers, "intermediate_size": 4 * hidden}
    if args.shape:  # a public model's layers; the vocabulary stays the tiny tokenizer's (the task's prompts)
        shape = SHAPES[args.shape]
        sizes = {"num_layers": shape["num_hidden_layers"], **{key: shape[key] for key in LAYER_KEYS}}
    model = build_tiny_model(root / "model", arch="qwen2", **sizes)
    data = prepare_task("arith", root / "data", seed=0, train_size=512, test_size=8, num_digits=2)
    return {"model": model, "train": data["train"], "val": data["test"]}


def pools(args: argparse.Namespace, mode: str) -> tuple[int, int]:
    """(training workers, rollout workers) of `mode`: colocated holds every role in each of the N workers (no
    rollout pool of its own); a split mode K and N - K, or 1 and 1 when N is 1 (on one GPU: the same device)."""
    if mode == "colocated":
        return args.gpus, 0
    return (1, 1) if args.gpus == 1 else (args.train_gpus, args.gpus - args.train_gpus)


def micro_batch(args: argparse.Namespace, mode: str) -> int:
    """Rows per micro-batch on each training worker: `--micro-batch-size`, at most the worker's share of a step."""
    return min(args.micro_batch_size, args.prompts * args.n // pools(args, mode)[0])


def overrides(found: dict[str, str], args: argparse.Namespace, mode: str) -> list[str]:
    train_workers, rollout_workers = pools(args, mode)
    return [
        f"data.train_files={found['train']}",
        f"data.val_files={found['val']}",
        f"data.train_batch_size={args.prompts}",
        "data.max_prompt_length=64",
        f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.model.path={found['model']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={args.gradient_checkpointing}",
        f"actor_rollout_ref.actor.fsdp_config.model_dtype={args.master_dtype}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch(args, mode)}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_batch(args, mode)}",
        f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.ignore_eos=True",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "algorithm.adv_estimator=grpo",
        "trainer.backend=ray",
        f"trainer.device={args.device}",
        f"trainer.ray_init.num_cpus={args.num_cpus}",
        f"trainer.n_gpus_per_node={train_workers}",
        *([f"trainer.rollout_n_gpus_per_node={rollout_workers}"] if rollout_workers else []),
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=False",
        f"trainer.experiment_name=async_rl_{mode}",
        f"async_training.chunk_prompts={1 if args.tool_delay_s else args.chunk_prompts}",
        *MODES[mode],
        *(gpu_overrides(args, mode) if args.device == "cuda" else []),
        *(AGENT_OVERRIDES if args.tool_delay_s else []),
    ]


SLOW_TOOL_LOOP = "async_rl_slow_tool_agent"
AGENT_OVERRIDES = [
    "data.return_raw_chat=True",
    "actor_rollout_ref.rollout.multi_turn.enable=True",
    f"actor_rollout_ref.rollout.agent.default_agent_loop={SLOW_TOOL_LOOP}",
]


def register_tool_turn_loop(name: str, tool: Callable[[], Awaitable[str]]) -> None:
    """Register the agent loop `name`: a turn of half the response budget, one call of `tool` (its answer is
    context, out of the loss), a second turn."""
    import dataclasses

    from hyflow.agent.loop import AgentData, AgentLoopBase, register_agent_loop
    from hyflow.agent.single_turn import prompt_ids_of

    @register_agent_loop(name)
    class ToolTurnLoop(AgentLoopBase):
        async def run(self, sampling_params, **kwargs):
            data = AgentData(request_id=kwargs["request_id"], messages=list(kwargs["raw_prompt"]))
            data.prompt_ids = prompt_ids_of(self.tokenizer, kwargs)
            params = dataclasses.replace(sampling_params, max_tokens=self.response_length // 2 - 1)
            for turn in range(2):
                if turn:
                    data.append_context_tokens(self.tokenizer.encode(await tool(), add_special_tokens=False))
                out = await self.server.generate(data.request_id, data.prompt_ids + data.response_ids, params)
                data.append_model_tokens(out.token_ids, out.log_probs, out.policy_versions)
            data.assistant_turns, data.tool_turns, data.finish_reason = 2, 1, out.finish_reason
            return data.to_output(self.response_length)


def slow_every_nth_tool(delay_s: float, every: int) -> Callable[[], Awaitable[str]]:
    """`--tool-delay-s`: a tool whose every `every`-th call takes `delay_s` seconds and the others answer at once
    (a long tail, as of code runs or searches)."""
    calls = itertools.count()

    async def tool() -> str:
        await asyncio.sleep(delay_s if next(calls) % every == 0 else 0.0)
        return " ok"

    return tool


def gpu_overrides(args: argparse.Namespace, mode: str) -> list[str]:
    """One GPU: a split placement's rollout worker shares the training worker's device (more: one GPU each)."""
    shared = ["trainer.rollout_shares_devices=True"] if mode != "colocated" and args.gpus == 1 else []
    return [*shared, f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}"]


def summarize(lines: list[dict], devices: int = 1) -> dict[str, float]:
    """Tokens/s over steps 2..N (in all, per each of the run's `devices`; per step: mean, std, min, max), idle
    fractions and weight-transfer seconds."""
    steps = [line["data"] for line in lines[1:]] or [line["data"] for line in lines]
    rates = [step["perf/total_num_tokens"] / step["timing_s/step"] for step in steps]

    def mean_of(key: str) -> float:
        values = [step[key] for step in steps if key in step]
        return statistics.fmean(values) if values else float("nan")

    tokens_per_s = sum(s["perf/total_num_tokens"] for s in steps) / sum(s["timing_s/step"] for s in steps)
    return {
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / devices,
        "tokens_per_s_mean": statistics.fmean(rates),
        "tokens_per_s_std": statistics.stdev(rates) if len(rates) > 1 else 0.0,
        "tokens_per_s_min": min(rates),
        "tokens_per_s_max": max(rates),
        "trainer_idle_frac": mean_of("async/trainer_idle_frac"),
        "rollout_idle_frac": mean_of("async/rollout_idle_frac"),
        "weight_transfer_s": mean_of("timing_s/weight_transfer"),
        "staleness_mean": mean_of("async/staleness_mean"),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return check_args(build_parser(), argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--modes", default="colocated,sync,one_step_off,async1", help=f"of {', '.join(MODES)}")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: GPUs (--gpus of them)")
    parser.add_argument("--gpus", type=int, default=1, help="devices N (CPU: worker processes); see Pools above")
    parser.add_argument("--train-gpus", type=int, default=None, help="split modes: training workers K (N / 2)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (16; 64 on cuda)")
    parser.add_argument("--n", type=int, default=None, help="samples per prompt (4; 8 on cuda)")
    parser.add_argument("--response-length", type=int, default=None, help="(32; 256 on cuda)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="a public model's layers (cuda: 0.5b)")
    parser.add_argument("--hidden-size", type=int, default=128, help="without --shape")
    parser.add_argument("--num-layers", type=int, default=4, help="without --shape")
    parser.add_argument("--master-dtype", choices=["fp32", "bf16"], default="fp32", help="the actor's weights")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="the actor's activations recomputed")
    parser.add_argument("--chunk-prompts", type=int, default=None, help="fully_async: prompts a request (4; 0: auto)")
    parser.add_argument("--micro-batch-size", type=int, default=None, help="update rows (a whole step; 64 on cuda)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="cuda: the engine's KV cache share")
    parser.add_argument("--tool-delay-s", type=float, default=0.0, help="> 0: agent loops with a slow tool (below)")
    parser.add_argument("--slow-every", type=int, default=8, help="--tool-delay-s: every N-th sample's tool is slow")
    parser.add_argument("--num-cpus", type=int, default=None, help="Ray's CPUs (2; cuda: 10 a GPU at least)")
    return parser


def check_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse `argv`, fill the device's defaults, and stop with a clear message on sizes the pools cannot split."""
    args = parser.parse_args(argv)
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.micro_batch_size = args.micro_batch_size or args.prompts * args.n
    if args.gpus < 1:
        parser.error(f"--gpus={args.gpus}: at least 1")
    if args.train_gpus is None:
        args.train_gpus = max(args.gpus // 2, 1)
    if args.gpus > 1 and not 1 <= args.train_gpus < args.gpus:
        parser.error(f"--train-gpus={args.train_gpus} must leave the rollout pool a device: 1..{args.gpus - 1}")
    if args.num_cpus is None:  # a GPU bundle of a Ray pool holds one CPU (hyflow.controller.ray_pool)
        args.num_cpus = max(os.cpu_count() or 1, args.gpus) if args.device == "cuda" else 2
    modes = args.modes.split(",")
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 1 is the warm-up)")
    rows = args.prompts * args.n
    for mode in modes:
        train_workers, rollout_workers = pools(args, mode)
        share = rows // train_workers
        if rows % train_workers or share % micro_batch(args, mode):
            parser.error(
                f"{mode}: the {rows} rows of a step (--prompts x --n) must split evenly over its {train_workers} "
                f"training worker(s) and each share ({rows / train_workers:g}) into micro-batches of "
                f"--micro-batch-size={micro_batch(args, mode)}. Fix: pick --prompts, --n and --micro-batch-size so."
            )
        chunk_rows = (1 if args.tool_delay_s else args.chunk_prompts) * args.n
        fully_async = "async_training.mode=fully_async" in MODES[mode]
        if fully_async and rollout_workers and chunk_rows % rollout_workers:  # 0 (auto): 256 rows an engine
            parser.error(
                f"{mode}: a request of --chunk-prompts={args.chunk_prompts} x --n={args.n} = {chunk_rows} rows does "
                f"not split over the {rollout_workers} rollout workers (the rest would be padding, generated for "
                "nothing). Fix: make --chunk-prompts x --n a multiple of N - K."
            )
    return args


def report_name(args: argparse.Namespace) -> str:
    return "async_rl.json" if args.gpus == 1 else f"async_rl_{args.gpus}gpu.json"


def print_table(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> None:
    """One row per mode: its pools, tokens/s (in all, per step, per device) and the ratios to colocated and sync."""
    print(f"{args.gpus} {'GPU' if args.device == 'cuda' else 'CPU worker'}(s): {args.prompts} prompts x {args.n}")
    header = f"{'mode':<14}{'pools T+R':>10}{'tokens/s':>10}{'per step (mean ± std, min..max)':>36}"
    print(header + f"{'tok/s/GPU':>11}{'vs coloc':>10}{'vs sync':>9}{'idle T/R':>12}")
    for mode, r in results.items():
        train_workers, rollout_workers = pools(args, mode)
        layout = f"{train_workers}" if not rollout_workers else f"{train_workers}+{rollout_workers}"
        spread = f"{r['tokens_per_s_mean']:.0f} ± {r['tokens_per_s_std']:.0f}, {r['tokens_per_s_min']:.0f}.."
        spread += f"{r['tokens_per_s_max']:.0f}"
        ratios = [f"{r[key]:.2f}x" if key in r else "-" for key in ("vs_colocated", "vs_sync")]
        idle = f"{r['trainer_idle_frac']:.2f}/{r['rollout_idle_frac']:.2f}"
        row = f"{mode:<14}{layout:>10}{r['tokens_per_s']:>10.0f}{spread:>36}{r['tokens_per_s_per_gpu']:>11.0f}"
        print(row + f"{ratios[0]:>10}{ratios[1]:>9}{idle:>12}")


def main() -> None:
    args = parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.tool_delay_s:
        register_tool_turn_loop(SLOW_TOOL_LOOP, slow_every_nth_tool(args.tool_delay_s, args.slow_every))
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as root:
        found = assets(Path(root) / "assets", args)
        for mode in args.modes.split(","):
            out = Path(root) / mode
            out.mkdir()
            results[mode] = summarize(train(overrides(found, args, mode), out), args.gpus)
            results[mode]["train_workers"], results[mode]["rollout_workers"] = pools(args, mode)
    for result in results.values():  # the same run's baselines
        for base in ("colocated", "sync"):
            if base in results:
                result[f"vs_{base}"] = result["tokens_per_s"] / results[base]["tokens_per_s"]
    print_table(args, results)
    summary = {"args": vars(args), "results": results}
    print(json.dumps(summary))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], report_name(args)).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
