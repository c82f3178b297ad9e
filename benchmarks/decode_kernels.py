"""The engine's decode kernels on their own, each next to its PyTorch baseline, in one process (CUDA).

    python benchmarks/decode_kernels.py            # decode attention launch sweep + the sampler, both decode shapes
    python benchmarks/decode_kernels.py --quick    # the current launch settings only

Shapes are those of a decode step of the Qwen2-0.5B shape (14 query / 2 KV heads of 64, vocabulary 151,936, KV
blocks of 16 tokens, random block tables): (c) 64 sequences with contexts of 64-320 tokens (the GRPO step's
generation), (a) 256 sequences with contexts of 256-512 (rollout_throughput's case a), (s1024) 1024 sequences
with contexts of 128-384 (its case s1024); and of the Qwen2.5-7B shape (28 query / 4 KV heads of 128): (7b) 256
sequences with contexts of 256-512.

- Decode attention (`triton_kernels.decode_attention`) for each launch setting (keys per loop iteration `block_n`,
  `num_warps`, `num_stages`), against `attention.sdpa_paged_attention` (gather the blocks, SDPA with a mask), with
  the largest difference from the current settings' output. The bandwidth bound is one read of every context's K/V.
- The sampler: the fused kernel alone (`sample_partials`, raw log-probs off as in RL rollouts, and on; with the
  noise's outer log exact for comparison), with its combine (`fused_sample`), against `sampler.sample_torch` (PyTorch
  ops, the same tokens).
- SwiGLU's silu(gate) * up (`triton_kernels.silu_and_mul`) against the torch.compile'd op at the shape's rows.

Times are GPU time per call: 24 calls (one per layer, as in a decode step) captured in a CUDA graph, replayed,
timed with CUDA events, so launch overhead does not count, as inside the engine's graphs.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import torch

from hyflow.engine import triton_kernels
from hyflow.engine.attention import AttentionMetadata, build_attention_mask, sdpa_paged_attention
from hyflow.engine.sampler import SamplingTensors, sample_torch

VOCAB, BLOCK_SIZE = 151936, 16
QWEN_05B, QWEN_7B = (14, 2, 64, 4864), (28, 4, 128, 18944)  # query heads, KV heads, head dim, MLP width
SHAPES = {  # name: (sequences, shortest context, longest context, model)
    "c": (64, 64, 320, QWEN_05B),
    "a": (256, 256, 512, QWEN_05B),
    "s1024": (1024, 128, 384, QWEN_05B),
    "7b": (256, 256, 512, QWEN_7B),
}
H200_BYTES_PER_S = 4.8e12


def gpu_microseconds(fn: Callable[[], object], calls: int = 24, replays: int = 20) -> float:
    """GPU time of one `fn()` in µs: `calls` calls in a CUDA graph, replayed `replays` times."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (calls * replays)


def attention_inputs(batch: int, shortest: int, longest: int, model: tuple, generator: torch.Generator):
    """q, the K/V caches, block tables and positions of a decode step with random contexts and random blocks."""
    heads, kv_heads, head_dim, _ = model
    max_blocks = -(-longest // BLOCK_SIZE)
    num_blocks = batch * max_blocks + 1
    device, dtype = "cuda", torch.bfloat16
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, head_dim, generator=generator).to(device, dtype)
    v_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, head_dim, generator=generator).to(device, dtype)
    tables = torch.randperm(num_blocks - 1, generator=generator)[: batch * max_blocks].view(batch, max_blocks)
    positions = torch.randint(shortest, longest, (batch,), generator=generator)
    q = torch.randn(batch, heads, head_dim, generator=generator).to(device, dtype)
    return q, k_cache, v_cache, tables.to(device), positions.to(device)


def bench_attention(name: str, quick: bool, generator: torch.Generator) -> None:
    batch, shortest, longest, model = SHAPES[name]
    _, kv_heads, head_dim, _ = model
    q, k_cache, v_cache, tables, positions = attention_inputs(batch, shortest, longest, model, generator)
    scale = head_dim**-0.5
    kv_bytes = int((positions + 1).sum()) * 2 * kv_heads * head_dim * 2
    bound_us = kv_bytes / H200_BYTES_PER_S * 1e6
    rows = torch.arange(batch, device="cuda")
    meta = AttentionMetadata(
        slot_mapping=rows, block_tables=tables, query_index=rows[:, None], query_positions=positions[:, None],
        token_index=rows, logits_index=rows,
    )  # fmt: skip
    mask = build_attention_mask(meta, BLOCK_SIZE)
    sdpa_us = gpu_microseconds(lambda: sdpa_paged_attention(q, k_cache, v_cache, meta, mask, scale))
    current = dict(triton_kernels.DECODE_LAUNCH)
    reference = triton_kernels.decode_attention(q, k_cache, v_cache, tables, positions, scale, None)
    print(
        f"decode attention ({name}): {batch} sequences, contexts {shortest}-{longest}, K/V {kv_bytes / 2**20:.1f} MiB, "
        f"bound {bound_us:.1f} us; SDPA gather path {sdpa_us:.1f} us"
    )
    settings = [current] if quick else [
        {"block_n": n, "num_warps": w, "num_stages": s}
        for n, w, s in itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 3))
    ]  # fmt: skip
    results = []
    for launch in settings:

        def run(launch=launch):
            return triton_kernels.decode_attention(q, k_cache, v_cache, tables, positions, scale, None, **launch)

        try:
            difference = (run().float() - reference.float()).abs().max().item()
            micros = gpu_microseconds(run)
        except Exception as error:  # a setting the compiler or the device cannot take (e.g. shared memory)
            print(f"  {launch}: failed ({type(error).__name__}: {str(error).splitlines()[0][:80]})")
            continue
        results.append((micros, launch, difference))
    current_us = next(micros for micros, launch, _ in results if launch == current)
    fastest = sorted(results, key=lambda r: r[0])[:8]
    shown = fastest + [r for r in results if r[1] == current and r not in fastest]
    for micros, launch, difference in shown:
        tag = " (current)" if launch == current else ""
        print(
            f"  {launch}{tag}: {micros:.2f} us, {current_us / micros:.2f}x current, {sdpa_us / micros:.1f}x SDPA, "
            f"{bound_us / micros:.0%} of bound, max diff {difference:.1e}"
        )


def bench_sampler(name: str, generator: torch.Generator) -> None:
    batch = SHAPES[name][0]
    if SHAPES[name][3] != QWEN_05B:
        return  # the sampler's shape is the vocabulary's, the same for both models
    logits = (3 * torch.randn(batch, VOCAB, generator=generator)).to("cuda", torch.bfloat16)
    st = SamplingTensors(
        temperatures=torch.ones(batch, device="cuda"), top_k=torch.full((batch,), -1, device="cuda"),
        top_p=torch.ones(batch, device="cuda"), seeds=torch.arange(batch, device="cuda") * 7 + 1,
        counters=torch.full((batch,), 5, device="cuda"), need_filter=False, need_raw=True,
    )  # fmt: skip
    args = (logits, st.temperatures, st.seeds, st.counters)
    kernel_us = gpu_microseconds(lambda: triton_kernels.sample_partials(*args))
    no_raw_us = gpu_microseconds(lambda: triton_kernels.sample_partials(*args, need_raw=False))
    exact_us = gpu_microseconds(lambda: triton_kernels.sample_partials(*args, need_raw=False, fast_log=False))
    fused_us = gpu_microseconds(lambda: triton_kernels.fused_sample(*args))
    torch_us = gpu_microseconds(lambda: sample_torch(logits, st), calls=4)
    same = bool((triton_kernels.fused_sample(*args)[0] == sample_torch(logits, st)[0]).all())
    bound_us = logits.numel() * 2 / H200_BYTES_PER_S * 1e6
    print(
        f"sampler ({name}): {batch} x {VOCAB} bf16 logits (bound {bound_us:.1f} us): kernel {kernel_us:.1f} us, "
        f"without raw {no_raw_us:.1f} us, exact outer log without raw {exact_us:.1f} us, "
        f"with its combine {fused_us:.1f} us, PyTorch ops {torch_us:.1f} us ({torch_us / fused_us:.1f}x the fused); "
        f"same tokens: {same}"
    )


def bench_silu(name: str, generator: torch.Generator) -> None:
    from hyflow.engine.models.ops import _silu_and_mul

    batch, width = SHAPES[name][0], SHAPES[name][3][3]
    x = torch.randn(batch, 2 * width, generator=generator).to("cuda", torch.bfloat16)
    triton_us = gpu_microseconds(lambda: triton_kernels.silu_and_mul(x))
    compiled_us = gpu_microseconds(lambda: _silu_and_mul(x))
    difference = (triton_kernels.silu_and_mul(x).float() - _silu_and_mul(x).float()).abs().max().item()
    bound_us = x.numel() * 3 / H200_BYTES_PER_S * 1e6  # bf16: read 2I, write I per row
    print(
        f"silu_and_mul ({name}): {batch} x {2 * width} bf16 (bound {bound_us:.1f} us): Triton {triton_us:.1f} us, "
        f"torch.compile {compiled_us:.1f} us ({compiled_us / triton_us:.2f}x), max diff {difference:.1e}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the current launch settings only")
    parser.add_argument("--shapes", default="c,a")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if not (torch.cuda.is_available() and triton_kernels.available()):
        raise SystemExit("decode_kernels.py needs CUDA and Triton")
    generator = torch.Generator().manual_seed(0)
    for name in args.shapes.split(","):
        bench_attention(name, args.quick, generator)
        bench_sampler(name, generator)
        bench_silu(name, generator)


if __name__ == "__main__":
    main()
