"""Host memory and time of loading a role's checkpoint into its FSDP2 shards on N ranks: the lean load (each rank
reads only its rows, `hyflow/workers/lean_load.py`) beside the full load it replaced (`from_pretrained` on every
rank, then FSDP2).

    torchrun --nproc-per-node 8 benchmarks/lean_load.py --shape 7b --role reward_model   # the reward model
    torchrun --nproc-per-node 8 benchmarks/lean_load.py --shape 7b --role actor          # the actor (and ref)
    torchrun --nproc-per-node 2 benchmarks/lean_load.py --tiny                           # CPU (gloo): a smoke test

Rank 0 first writes a checkpoint of random weights of the shape into `--folder` (bf16 safetensors, the role's model
class: a causal LM, or a sequence classifier with one label; kept, and reused by later runs), then every rank loads
it with the role's own builder (`builders.policy_maker`, `reward_model.reward_model_maker`), master weights in
`--model-dtype` (the workers' default fp32): lean first, then full, after both have loaded a tiny checkpoint once
(so one-time costs, lazy imports and the first collectives, fall on neither). Per variant and rank: the peak of the
process's private host memory (`RssAnon`, sampled every 2 ms; the checkpoint's page cache is shared by the node's
ranks and not counted) above where it started, the seconds to the last rank's end, and what the lean load read.
Printed: the largest rank's peak and the node's sum; with `$OUT` set the JSON goes to
`$OUT/lean_load_<role>_<shape>_<N>rank.json`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from shapes import SHAPES
from torchrun_group import init_process_group
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, Qwen2Config

from hyflow.config.common import FSDPConfig, ModelConfig
from hyflow.config.reward import RewardModelConfig
from hyflow.workers.builders import policy_maker
from hyflow.workers.fsdp import apply_fsdp2, build_device_mesh
from hyflow.workers.lean_load import build_sharded
from hyflow.workers.reward_model import reward_model_maker


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(set(SHAPES) - {"tiny"}), default="7b")
    parser.add_argument("--tiny", action="store_true", help="the tiny shape on CPU (gloo)")
    parser.add_argument("--role", choices=["actor", "reward_model"], default="reward_model")
    parser.add_argument("--model-dtype", choices=["fp32", "bf16"], default="fp32", help="fsdp_config.model_dtype")
    parser.add_argument("--folder", help="the checkpoint (written when missing; default: under the temp folder)")
    return parser.parse_args()


def private_host_bytes() -> int:
    """This process's resident anonymous memory (`RssAnon`: its own, not the page cache of mapped files)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no RssAnon line (Linux only)")


class PeakHostMemory:
    """The peak of `private_host_bytes()` above its value on entering, sampled every 2 ms on a thread."""

    def __enter__(self) -> PeakHostMemory:
        self.start, self.peak, self._stop = private_host_bytes(), 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, private_host_bytes() - self.start)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, private_host_bytes() - self.start)


def write_checkpoint(folder: str, shape: str, role: str, device: torch.device) -> None:
    """Random weights of `shape` (bf16, built on `device`) saved as the role's Hugging Face model, with one label
    and no padding token for a reward model."""
    config = Qwen2Config(**{"rope_theta": 1000000.0, **SHAPES[shape]}, max_position_embeddings=4096)
    model_class = AutoModelForCausalLM if role == "actor" else AutoModelForSequenceClassification
    config.num_labels, config.pad_token_id = 1, 0
    with torch.device(device):
        model = model_class.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)


def maker(role: str, folder: str, fsdp_config: FSDPConfig):
    if role == "actor":
        return policy_maker(ModelConfig(path=folder), fsdp_config, folder, trainable=True)
    config = RewardModelConfig(enable=True)
    config.model.path, config.model.fsdp_config = folder, fsdp_config
    return reward_model_maker(config, folder, pad_token_id=0)


def timed_load(make, folder: str, fsdp_config: FSDPConfig, lean: bool) -> dict[str, Any]:
    """Load once (lean or full) and free it: this rank's host peak, the slowest rank's seconds, the lean stats."""
    mesh = build_device_mesh()
    dist.barrier()
    start = time.perf_counter()
    with PeakHostMemory() as memory:
        if lean:
            module, stats = build_sharded(make, folder, fsdp_config, mesh)
        else:
            module, stats = apply_fsdp2(make(False)[0], fsdp_config, mesh), None
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        dist.barrier()
    seconds = time.perf_counter() - start
    result = {"peak_host_gb": memory.peak / 1e9, "seconds": seconds}
    if stats is not None:
        result |= {"mode": stats.mode, "read_gb": stats.bytes_read / 1e9, "largest_read_gb": stats.largest_read / 1e9}
    del module
    gc.collect()
    return result


def summary(args, shape: str, world: int, device: torch.device, folder: str, per_rank: list) -> dict[str, Any]:
    """The run's JSON (every rank's numbers, the largest rank's peak and the node's sum per variant), printed."""
    result: dict[str, Any] = {"role": args.role, "shape": shape, "ranks": world, "model_dtype": args.model_dtype}
    result["device"] = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result["checkpoint_gb"] = sum(f.stat().st_size for f in Path(folder).glob("*.safetensors")) / 1e9
    result["per_rank"] = per_rank
    print(
        f"lean load: the {args.role} of the {shape} shape ({result['checkpoint_gb']:.2f} GB of bf16 safetensors) "
        f"into {args.model_dtype} FSDP2 shards over {world} ranks, on {result['device']}"
    )
    for name in ("lean", "full"):
        peaks = [ranks[name]["peak_host_gb"] for ranks in per_rank]
        seconds = max(ranks[name]["seconds"] for ranks in per_rank)
        result[name] = {"max_rank_peak_host_gb": max(peaks), "node_peak_host_gb": sum(peaks), "seconds": seconds}
        line = f"{name:>5}: {max(peaks):.3f} GB private host memory at the largest rank's peak, "
        line += f"{sum(peaks):.3f} GB summed over the node, {seconds:.1f} s"
        if name == "lean":
            read = sum(ranks["lean"]["read_gb"] for ranks in per_rank)
            line += f", {read:.3f} GB read by all ranks ({per_rank[0]['lean']['mode']})"
        print(line)
    return result


def main() -> None:
    args = parse_args()
    device = init_process_group()
    world, rank = dist.get_world_size(), dist.get_rank()
    shape = "tiny" if args.tiny else args.shape
    folder = args.folder or os.path.join(tempfile.gettempdir(), f"hyflow_lean_load_{args.role}_{shape}")
    warmup = f"{folder}_warmup"  # the tiny shape: both variants load it once first, untimed
    for path, path_shape in ((warmup, "tiny"), (folder, shape)):
        if rank == 0 and not os.path.isfile(os.path.join(path, "config.json")):
            write_checkpoint(path, path_shape, args.role, device)
    dist.barrier()
    fsdp_config = FSDPConfig(model_dtype=args.model_dtype)
    for lean in (True, False):  # one-time costs (lazy imports, first collectives) fall on neither variant
        timed_load(maker(args.role, warmup, fsdp_config), warmup, fsdp_config, lean)
    make = maker(args.role, folder, fsdp_config)
    variants = {"lean": timed_load(make, folder, fsdp_config, lean=True)}
    variants["full"] = timed_load(make, folder, fsdp_config, lean=False)
    per_rank: list[Any] = [None] * world
    dist.all_gather_object(per_rank, variants)
    if rank == 0:
        result = summary(args, shape, world, device, folder, per_rank)
        print(json.dumps(result))
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], f"lean_load_{args.role}_{shape}_{world}rank.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
