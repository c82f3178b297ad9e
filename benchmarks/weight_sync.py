"""Weight sync time and bytes: a trainer's FSDP2 shards into the generation engines' weights, on N ranks.

    torchrun --nproc-per-node 8 benchmarks/weight_sync.py --shape 7b               # 8 engines, one per GPU
    torchrun --nproc-per-node 8 benchmarks/weight_sync.py --shape 7b --tp 4        # 2 engines of 4 GPUs each
    torchrun --nproc-per-node 8 benchmarks/weight_sync.py --shape 32b --tp 8       # 1 engine over 8 GPUs
    torchrun --nproc-per-node 4 benchmarks/weight_sync.py --tiny --tp 2            # CPU (gloo): a smoke test

Every rank holds what the hybrid worker holds: the actor, a Qwen2-shaped model of random weights sharded by FSDP2
over all ranks (per decoder layer, fp32 master weights or `--master-dtype bf16`), and its engine's model (bf16 on
CUDA, fp32 on CPU; with `--tp`, this rank's TP shard of it, `tp` consecutive ranks per engine). One sync is
`engine.load_weights(iter_bucketed_state(actor, ...))`, as `ActorRolloutRefWorker.rollout_mode` runs it: buckets
of `--bucket-mb`, cast to the engine's dtype before the collective, each TP rank receiving only its slices. With
`--compare-full` the sync that every rank received the full tensors of (the engine cutting its slices) runs too.

Printed per variant: seconds per sync (the slowest rank, median of `--repeats` after one warm-up), what each rank
loaded and received (GB), the buckets, and the wait for collectives the overlap did not hide. With `$OUT` set the
JSON goes to `$OUT/weight_sync_<shape>_<N>rank_tp<T>.json`. Goal at 7B on 8 GPUs (issue #23): at most 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from shapes import SHAPES
from torch.distributed.fsdp import fully_shard
from torchrun_group import init_process_group
from transformers import AutoModelForCausalLM, Qwen2Config

from hyflow.engine.models import build_model, tp_weight_slices
from hyflow.engine.parallel import TensorParallel
from hyflow.workers.fsdp import build_device_mesh
from hyflow.workers.weight_sync import SyncStats, iter_bucketed_state


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(set(SHAPES) - {"tiny"}), default="7b")
    parser.add_argument("--tiny", action="store_true", help="the tiny shape on CPU (gloo)")
    parser.add_argument("--tp", type=int, default=1, help="ranks per engine (rollout.tensor_model_parallel_size)")
    parser.add_argument("--bucket-mb", type=int, default=256, help="rollout.update_weights_bucket_megabytes")
    parser.add_argument("--master-dtype", choices=["fp32", "bf16"], default="fp32", help="the actor's weights")
    parser.add_argument("--repeats", type=int, default=3, help="timed syncs after one warm-up")
    parser.add_argument("--compare-full", action="store_true", help="also time the full-tensor sync")
    return parser.parse_args(argv)


def sharded_actor(config: Qwen2Config, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """The model under FSDP2 (each decoder layer, then the root), random weights: built on the meta device and
    materialised shard by shard, so no rank ever holds the whole model."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    mesh = build_device_mesh()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device=device)
    with torch.no_grad():
        for param in model.parameters():
            param.to_local().normal_(0.0, 0.02)
    return model


def timed_syncs(actor: torch.nn.Module, engine: torch.nn.Module, args: argparse.Namespace, sliced: bool) -> dict:
    """One warm-up and `--repeats` syncs; the slowest rank's seconds of each, and rank 0's stats of the last."""
    slices = (lambda name: tp_weight_slices(engine.args, name)) if sliced else None
    dtype = next(engine.parameters()).dtype
    seconds = []
    for _ in range(1 + args.repeats):
        stats = SyncStats()
        dist.barrier()
        start = time.perf_counter()
        engine.load_weights(iter_bucketed_state(actor, args.bucket_mb << 20, stats, slices, dtype))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=stats_device())
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        seconds.append(float(elapsed))
    return {"seconds": seconds[1:], "median_s": statistics.median(seconds[1:]), **stats.metrics("sync")}


def stats_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def main() -> None:
    args = parse_args()
    device = init_process_group()
    world, rank = dist.get_world_size(), dist.get_rank()
    shape = "tiny" if args.tiny else args.shape
    config = Qwen2Config(**{"rope_theta": 1000000.0, **SHAPES[shape]}, max_position_embeddings=4096)
    config.architectures = ["Qwen2ForCausalLM"]
    master = torch.float32 if args.master_dtype == "fp32" else torch.bfloat16
    actor = sharded_actor(config, master, device)
    engine_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    engine = build_model(config, 4096, engine_dtype, device, TensorParallel.from_world(args.tp))
    result: dict[str, Any] = {"shape": shape, "ranks": world, "tp": args.tp, "bucket_mb": args.bucket_mb}
    result["num_params"] = sum(p.numel() for p in actor.parameters())
    result["device"] = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result["sliced"] = timed_syncs(actor, engine, args, sliced=True)
    if args.compare_full:
        result["full"] = timed_syncs(actor, engine, args, sliced=False)
    if rank == 0:
        print(f"weight sync: {shape} ({result['num_params'] / 1e9:.2f}B params) over {world} ranks, engines of "
              f"TP {args.tp}, buckets of {args.bucket_mb} MB, on {result['device']}")  # fmt: skip
        for name in ("sliced", "full"):
            if name in result:
                r = result[name]
                print(f"{name:>7}: {r['median_s']:.3f} s/sync (slowest rank), {r['sync_gb'] * 1e3:.1f} MB loaded and "
                      f"{r['sync_comm_gb'] * 1e3:.1f} MB received per rank, {r['sync_buckets']:.0f} buckets, "
                      f"{r['sync_wait_s']:.3f} s waiting")  # fmt: skip
        print(json.dumps(result))
        if os.environ.get("OUT"):
            name = f"weight_sync_{shape}_{world}rank_tp{args.tp}.json"
            Path(os.environ["OUT"], name).write_text(json.dumps(result) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
