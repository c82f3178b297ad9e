"""The report of `grpo_step.py`: its table on stdout and its JSON line (stdout and `$OUT`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def print_table(result: dict[str, Any], sides: dict[str, str]) -> None:
    """Step times, generated tokens/s and peak memory of every side (`sides`: result key -> column), hyflow's
    stages, and the ratios."""
    hyflow = result.get("hyflow")
    shape = result["shape"]
    where = f"{result['gpus']} x {result['device']} ({result['backend']} backend, engines of TP {shape.get('tp', 1)})"
    print(f"\nGRPO step on {where}: {shape['num_params'] / 1e6:.1f}M params, {shape['prompts']} prompts x "
          f"{shape['n']} samples, {shape['prompt_length']} -> {shape['response_length']} tokens")  # fmt: skip
    print(f"{'':<28}" + "".join(f"{column:>12}" for column in sides.values()))

    def row(label: str, key: str, unit: str = "s", digits: int = 2) -> None:
        cells = [result.get(side) for side in sides]
        print(f"{label:<28}" + "".join(
            f"{side[key]:>11.{digits}f}{unit}" if side and key in side else f"{'-':>12}" for side in cells
        ))  # fmt: skip

    row("step 1 (warm-up)", "warmup_s")
    row(f"steps 2-{shape['steps']} mean", "mean_s")
    row(f"steps 2-{shape['steps']} min", "min_s")
    row(f"steps 2-{shape['steps']} max", "max_s")
    row("generated tok/s", "generated_tokens_per_s", " ", 0)
    row("generated tok/s per GPU", "generated_tokens_per_s_per_gpu", " ", 0)
    row("peak memory", "peak_memory_gib", "G", 1)
    for name, seconds in (hyflow or {}).get("stages_mean_s", {}).items():
        print(f"{'  hyflow ' + name:<28}{seconds:>11.3f}s")
    for name, value in (hyflow or {}).get("weight_sync_mean", {}).items():  # per rank: rollout/weight_sync_gb, ...
        print(f"{'  hyflow ' + name.removeprefix('rollout/'):<28}{value:>12.4f}")
    for name, seconds in (result.get("verl") or {}).get("verl_stages_mean_s", {}).items():
        print(f"{'  verl ' + name:<28}{seconds:>11.3f}s")
    if hyflow and "graph_captures" in hyflow:
        print(f"{'  hyflow graphs captured':<28}{hyflow['graph_captures']} (per step)")
    for side in ("trl", "trl_vllm", "verl"):
        if f"ratio_{side}_over_hyflow" in result:
            print(f"{sides[side]} / hyflow (steps 2-{shape['steps']} mean): {result[f'ratio_{side}_over_hyflow']:.2f}x")
        if "stopped" in (result.get(side) or {}):
            print(f"{sides[side]} ran {result[side]['stopped']}")
        for key in ("skipped", "error"):
            if f"{side}_{key}" in result:
                print(f"{sides[side]} {key}: {result[f'{side}_{key}']}")


def write_result(result: dict[str, Any], echo: bool = True) -> None:
    """The JSON line on stdout, and in `$OUT/grpo_step.json` when `$OUT` is set (also after the first side, so a
    crash or a timeout in the second one keeps the first one's numbers)."""
    line = json.dumps(result)
    if echo:
        print(line, flush=True)
    if os.environ.get("OUT"):
        name = "grpo_step.json" if result["backend"] == "local" else f"grpo_step_ray_{result['gpus']}gpu.json"
        Path(os.environ["OUT"], name).write_text(line + "\n")
