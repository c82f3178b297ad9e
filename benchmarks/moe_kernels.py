"""The fused MoE layer's kernels (hyflow/engine/triton_moe.py) against the bytes they must read, and a tile sweep.

    python benchmarks/moe_kernels.py                      # GPU: Qwen3-30B-A3B's experts, decode and prefill rows
    python benchmarks/moe_kernels.py --sweep              # also time each tile setting of SWEEP per row count

One MoE layer of the Qwen3-30B-A3B shape (128 experts, 8 per token, hidden 2048, expert width 768, bf16) on T
tokens with uniform random routing. Reported per T: the fused layer's time (CUDA events, median of 20 after 5
warm-ups, inside one CUDA graph as the engine runs it), the eager grouped path (moe.grouped_experts, one matmul pair
per expert, a host sync) for comparison, and the bandwidth bound: the expert weights the T
tokens touch (X·(1 − (1 − k/X)^T) experts in expectation) read once at the device's peak bandwidth.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from rollout_throughput import peak_bandwidth  # this script's folder

from hyflow.engine import triton_moe
from hyflow.engine.models.moe import grouped_experts, route

SWEEP = [
    {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": s}
    for m in (16, 32, 64)
    for n in (64, 128)
    for k in (64, 128)
    for w, s in ((4, 3), (8, 4))
]


def _inputs(tokens: int, experts: int, top_k: int, hidden: int, width: int):
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w13 = torch.randn(experts, 2 * width, hidden, device="cuda", dtype=torch.bfloat16) / hidden**0.5
    w2 = torch.randn(experts, hidden, width, device="cuda", dtype=torch.bfloat16) / width**0.5
    weights, ids = route(torch.randn(tokens, experts, device="cuda"), top_k, True, torch.bfloat16)
    return x, ids, weights, w13, w2


def _time_graph(fn, repeats: int = 20) -> float:
    """Median seconds of `fn` replayed as one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the inputs were made on the default stream
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _time(graph.replay, repeats)


def _time(fn, repeats: int = 20) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def bound_seconds(tokens: int, experts: int, top_k: int, hidden: int, width: int, bandwidth: float) -> float:
    touched = experts * (1 - (1 - top_k / experts) ** tokens)
    return touched * 3 * hidden * width * 2 / bandwidth


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="1,16,64,256,1024,8192", help="comma-separated token counts T")
    parser.add_argument("--sweep", action="store_true", help="time every tile setting of SWEEP per T")
    args = parser.parse_args(argv)
    try:
        args.token_counts = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens={args.tokens}: give comma-separated whole numbers, e.g. 1,256,8192")
    return args


def main() -> None:
    args = parse_args()
    name, bandwidth = torch.cuda.get_device_name(), peak_bandwidth()
    experts, top_k, hidden, width = 128, 8, 2048, 768
    print(f"device {name}; Qwen3-30B-A3B experts: X={experts} k={top_k} E={hidden} I={width}, bf16")
    for tokens in args.token_counts:
        x, ids, weights, w13, w2 = _inputs(tokens, experts, top_k, hidden, width)
        bound = bound_seconds(tokens, experts, top_k, hidden, width, bandwidth)
        fused = _time_graph(lambda: triton_moe.fused_experts(x, ids, weights, w13, w2))  # noqa: B023
        eager = _time(lambda: grouped_experts(x, ids, weights, w13, w2))  # noqa: B023
        config = triton_moe.launch_config(tokens * top_k, experts, x.element_size())
        print(
            f"T={tokens:5d}: fused {fused * 1e6:8.1f} us ({bound / fused:4.0%} of the bandwidth bound "
            f"{bound * 1e6:.1f} us; tiles {config}); eager grouped {eager * 1e6:8.1f} us ({eager / fused:.1f}x)",
            flush=True,
        )
        if args.sweep:
            results = []
            for setting in SWEEP:
                triton_moe.launch_config = lambda *_, s=setting: s
                try:
                    seconds = _time_graph(lambda: triton_moe.fused_experts(x, ids, weights, w13, w2))  # noqa: B023
                    results.append((seconds, setting))
                except Exception as error:  # a tile too large for shared memory: skip it
                    print(f"  {setting}: {type(error).__name__}")
            triton_moe.launch_config = _LAUNCH_CONFIG
            for seconds, setting in sorted(results, key=lambda r: r[0])[:3]:
                print(f"  sweep best: {seconds * 1e6:8.1f} us ({bound / seconds:4.0%}) {setting}", flush=True)


_LAUNCH_CONFIG = triton_moe.launch_config

if __name__ == "__main__":
    main()
