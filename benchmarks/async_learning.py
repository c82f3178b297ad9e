"""Does asynchronous training still learn? The demo's GRPO phase, synchronous against one-step off-policy and fully
asynchronous (staleness 1 and 4), on a split placement (1 training + 1 rollout Ray worker, CPU), same seed.

    python benchmarks/async_learning.py                         # the demo's sizes: 80 steps of 64 prompts x 8
    python benchmarks/async_learning.py --steps 30 --test-freq 5 --prompts 16 --samples 4 --sft-steps 150 \
        --test-size 64                                          # the reduced run reported in benchmarks/README.md
    python benchmarks/async_learning.py --modes one_step_off,async1 --correction bypass --steps 100 --test-freq 10 \
        --sync-final 0.527                                      # corrected, against the recorded synchronous run

The model is `hyflow demo`'s tiny one, SFT-trained on the synthetic arithmetic task (built once under `--assets`
and reused), and every run uses the demo's GRPO settings (`hyflow.demos.runner.grpo_overrides`: two optimizer steps per
batch, lr 1e-3, validation at temperature 1 with 4 samples per prompt) with `trainer.placement=split`; the
asynchronous runs generate in chunks of `--chunk-prompts` prompts, and `--correction` picks their off-policy
correction (`CORRECTIONS`: none, decoupled PPO with token TIS, or bypass PPO clipped against the engine's
log-probs). The synchronous split run has the colocated run's metrics exactly (tests/trainer/test_ppo_async_ray.py),
so it stands for it.

Printed per mode: the validation accuracy (`val-core/arith/acc/mean@4`) before training, at the end and at its
best, the first validated step at which it reached the synchronous run's final accuracy (minus `--tolerance`),
the mean staleness and the wall time; then one JSON line (also `$OUT/async_learning.json` when `$OUT` is set).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

MODES = {
    "sync": ["async_training.mode=sync"],
    "one_step_off": ["async_training.mode=one_step_off"],
    "async1": ["async_training.mode=fully_async", "async_training.max_staleness=1"],
    "async4": ["async_training.mode=fully_async", "async_training.max_staleness=4"],
}
ENGINE_LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=True"
CORRECTIONS = {  # for the stale modes (`sync` stays the uncorrected reference)
    "none": [],
    # decoupled PPO: the ratio against the recomputed π_old (the proximal policy), token-level TIS π_old/π_rollout
    "tis": [
        ENGINE_LOG_PROBS,
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0",
    ],
    # PPO's ratio and clip against the behaviour policy itself (π_old := π_rollout): no old-log-prob pass
    "bypass": [ENGINE_LOG_PROBS, "algorithm.rollout_correction.bypass_mode=True"],
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=80, help="GRPO steps per run (the demo's 80)")
    parser.add_argument("--prompts", type=int, default=64, help="prompts per GRPO step (the demo's 64)")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (the demo's 8)")
    parser.add_argument("--sft-steps", type=int, default=400, help="SFT steps at most (the demo's 400)")
    parser.add_argument("--test-size", type=int, default=200, help="validation prompts (the demo's 200)")
    parser.add_argument("--assets", default="async_learning_assets", help="where the SFT'd model is kept")
    parser.add_argument("--test-freq", type=int, default=5, help="validate every N steps")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--chunk-prompts", type=int, default=8, help="fully_async: prompts per generation request")
    parser.add_argument(
        "--sync-final",
        type=float,
        default=None,
        help="the synchronous run's final accuracy, when `sync` is not among --modes (e.g. a recorded run's)",
    )
    parser.add_argument("--tolerance", type=float, default=0.02, help="'reached' = within this of sync's final acc")
    parser.add_argument(
        "--correction",
        choices=sorted(CORRECTIONS),
        default="none",
        help="the off-policy correction of the stale modes: none, tis (decoupled PPO + token TIS), bypass (PPO "
        "clipped against the engine's log-probs)",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        help="an extra config override for every mode (repeatable), e.g. algorithm.rollout_correction.rollout_is=token",
    )
    parser.add_argument("--num-cpus", type=int, default=2, help="Ray's CPUs (one per worker)")
    args = parser.parse_args()
    unknown = [mode for mode in args.modes.split(",") if mode not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    return args


def demo_grpo_overrides(args: argparse.Namespace, folder: Path) -> list[str]:
    """The demo's tiny model SFT-trained on its arithmetic task (built once under `folder`), and the demo's GRPO
    settings for it, with this run's sizes."""
    from hyflow.demos.plot import DemoTable
    from hyflow.demos.runner import DemoPlan, build_assets, grpo_overrides, run_sft_phase

    plan = DemoPlan(
        sft_steps=args.sft_steps, grpo_prompts=args.prompts, grpo_samples=args.samples, test_size=args.test_size
    )
    ready = folder / "ready.json"
    if ready.is_file():
        model, data = json.loads(ready.read_text())
    else:
        base_model, data = build_assets(plan, folder)
        model = run_sft_phase(plan, base_model, data, folder, DemoTable(phase="sft"))
        ready.write_text(json.dumps([model, data]))
    demo = grpo_overrides(plan, model, data, folder, device="cpu")
    return [line for line in demo if not line.startswith(("trainer.logger=", "trainer.default_local_dir="))]


def mode_overrides(mode: str, correction: str) -> list[str]:
    """The keys of `mode`, with the off-policy `correction` for a stale mode (`sync` is the uncorrected reference)."""
    return [*MODES[mode], *(CORRECTIONS[correction] if mode != "sync" else [])]


def run_mode(mode: str, args: argparse.Namespace, demo: list[str], out: Path) -> dict:
    """Train one mode; returns {step: validation accuracy}, the mean staleness and the wall time."""
    from async_rl import train  # this folder's throughput benchmark: the same way of running a mode

    from hyflow.demos.plot import val_accuracy

    overrides = [
        *demo,
        "trainer.backend=ray",
        "trainer.placement=split",
        f"trainer.ray_init.num_cpus={args.num_cpus}",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.test_freq}",
        f"trainer.experiment_name=async_learning_{mode}",
        f"async_training.chunk_prompts={args.chunk_prompts}",
        *mode_overrides(mode, args.correction),
        *args.override,
    ]
    started = time.perf_counter()
    lines = train(overrides, out)
    accuracy = {line["step"]: val_accuracy(line["data"]) for line in lines}
    staleness = [line["data"]["async/staleness_mean"] for line in lines if "async/staleness_mean" in line["data"]]
    return {
        "val_acc": {step: acc for step, acc in accuracy.items() if acc is not None},
        "staleness_mean": sum(staleness) / max(1, len(staleness)),
        "wall_s": time.perf_counter() - started,
    }


def first_step_reaching(val_acc: dict[int, float], target: float) -> int | None:
    return next((step for step, acc in sorted(val_acc.items()) if step > 0 and acc >= target), None)


def main() -> None:
    args = parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    modes = args.modes.split(",")
    results = {}
    demo = demo_grpo_overrides(args, Path(args.assets).resolve())
    with tempfile.TemporaryDirectory() as root:
        for mode in modes:
            out = Path(root) / mode
            out.mkdir()
            results[mode] = run_mode(mode, args, demo, out)
    reference = results.get("sync")
    sync_final = reference["val_acc"][max(reference["val_acc"])] if reference is not None else args.sync_final
    target = None if sync_final is None else sync_final - args.tolerance
    print(f"{'mode':<14}{'acc@0':>8}{'final':>8}{'best':>8}{'reached@':>10}{'staleness':>11}{'wall s':>9}")
    for mode, result in results.items():
        acc = result["val_acc"]
        reached = first_step_reaching(acc, target) if target is not None else None
        result["reached_sync_final_at_step"] = reached
        print(
            f"{mode:<14}{acc.get(0, float('nan')):>8.3f}{acc[max(acc)]:>8.3f}{max(acc.values()):>8.3f}"
            f"{reached if reached is not None else '-':>10}{result['staleness_mean']:>11.2f}{result['wall_s']:>9.0f}"
        )
    summary = {
        "steps": args.steps,
        "correction": args.correction,
        "target": target,
        "tolerance": args.tolerance,
        "results": results,
    }
    print(json.dumps(summary))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "async_learning.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
