"""How `grpo_step.py` runs and times one side: in a process state of its own, then summarized over steps 2..N.

    summary = measured_side(run, args, assets, root)   # run(args, assets, root) -> {"step_s": [...], ...}

Step 1 is reported apart (warm-up: compilation, CUDA graphs, allocator); the rest is the mean, min and max of steps
2..N, generated tokens/s (per GPU too), each stage's mean when the side reports stages, and on CUDA the side's
peak memory.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

STAGE_ORDER = ["gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"]


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


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measured_side(
    run: Callable[..., dict[str, Any]], args: argparse.Namespace, assets: dict[str, Any], root: Path
) -> dict[str, Any]:
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
    if "stopped" in side:  # a peer stopped by its timeout after some steps: they are measured, the note says so
        summary["stopped"] = side["stopped"]
    if any(side.get("response_length_mean") or []):
        summary["response_length_mean"] = side["response_length_mean"]
    if on_this_gpu:
        summary["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        summary["memory_left_gib"] = torch.cuda.memory_allocated() / 2**30
    return summary
