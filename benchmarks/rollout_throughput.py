"""Generation throughput of hyflow's engine next to vLLM and `transformers.generate`, on random-weight models.

    python benchmarks/rollout_throughput.py              # GPU: Qwen2-0.5B shape, bf16, cases (a) and (b)
    python benchmarks/rollout_throughput.py --shape 7b --cases a,d --no-hf   # Qwen2.5-7B shape
    python benchmarks/rollout_throughput.py --cases long --no-hf   # 64 prompts x 256 -> 4096 new tokens
    python benchmarks/rollout_throughput.py --shape 30b-a3b --num-layers 16 --cases a,b   # Qwen3-30B-A3B, 16 layers
    python benchmarks/rollout_throughput.py --tiny       # CPU: a tiny model, small shapes (minutes on a laptop)
    python benchmarks/rollout_throughput.py --no-hf --no-vllm   # engine only
    python benchmarks/rollout_throughput.py --no-hf --num-scheduler-steps 1   # one host round trip per token
    python benchmarks/rollout_throughput.py --no-hf --no-async-scheduling     # no window queued ahead
    torchrun --nproc-per-node 2 benchmarks/rollout_throughput.py --tensor-parallel-size 2   # the engine, TP=2

Cases: (a) 256 prompts x 256 prompt tokens -> 256 new tokens each (ignore_eos);
       (b) GRPO shape: 64 prompts x 512 prompt tokens, n=8, 512 new tokens (the 8 samples share the prompt's cache);
       (c) the generation of benchmarks/grpo_step.py: 8 prompts x 64 tokens, n=8, 256 new tokens;
       (d) 64 prompts x 512 tokens -> 512 new tokens (n=1: the 7B shape's second case);
       (long) 64 prompts x 256 tokens -> 4096 new tokens;
       (s256) and (s1024): 256 and 1024 prompts x 128 tokens -> 256 new tokens (how throughput scales with the
       batch: the engine's `max_num_seqs` and CUDA-graph ladder reach the largest case's rows).
Every case runs once as warm-up (at most 512 new tokens) and then `--repeats` times, each run on fresh random
prompts; each side gets the same prompts. vLLM 0.25.0 (`rollout_throughput_vllm.py`, log-probs on, the settings of
../shared/peers/README.md) runs first, in its own engine process, and is skipped with a message where it is not
importable; `transformers.generate` runs once on the last repeat's prompts.
For the engine it also prints the mean decode step time (a multi-step decode window counts as its number of steps)
next to the memory-bandwidth bound of that step (weights + the KV cache read once per step, over the device's peak
bandwidth). With `$OUT` set, every number also goes to `$OUT/rollout_throughput_<shape>.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rollout_throughput_vllm import VLLMGenerator, vllm_missing  # this script's folder; imports vLLM only to run
from shapes import MOE_SHAPES, SHAPES
from transformers import AutoModelForCausalLM, PretrainedConfig, Qwen2Config, Qwen3MoeConfig

from hyflow.engine import triton_step
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.models.llama import Attention

PEAK_BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}  # bytes/s, the vendors' datasheets (HBM3, HBM3e)


def peak_bandwidth() -> float:
    """The memory bandwidth of this GPU by its name (an H200's where the name is neither)."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return next((value for key, value in PEAK_BANDWIDTH.items() if key in name), PEAK_BANDWIDTH["H200"])


@dataclass
class Case:
    name: str
    num_prompts: int
    prompt_len: int
    n: int
    new_tokens: int


GPU_CASES = [
    Case("a", 256, 256, 1, 256),
    Case("b", 64, 512, 8, 512),
    Case("c", 8, 64, 8, 256),
    Case("d", 64, 512, 1, 512),
    Case("long", 64, 256, 1, 4096),
    Case("s256", 256, 128, 1, 256),
    Case("s1024", 1024, 128, 1, 256),
]
TINY_CASES = [
    Case("a", 32, 32, 1, 32),
    Case("b", 8, 64, 8, 64),
    Case("c", 4, 16, 4, 32),
    Case("d", 8, 64, 1, 64),
    Case("long", 4, 16, 1, 256),
    Case("s256", 8, 16, 1, 32),
    Case("s1024", 32, 16, 1, 32),
]
WARMUP_TOKENS = 512  # a warm-up run generates at most this many tokens per sequence: it compiles and captures


def model_config(shape: str, max_model_len: int = 2048, num_layers: int | None = None) -> PretrainedConfig:
    """The random-weight model's config: a Qwen2 shape of `SHAPES`, or a Qwen3-MoE shape of `MOE_SHAPES`."""
    sizes = {**SHAPES, **MOE_SHAPES}[shape]
    if num_layers is not None:
        sizes = {**sizes, "num_hidden_layers": num_layers}
    config_cls, arch = (
        (Qwen3MoeConfig, "Qwen3MoeForCausalLM") if shape in MOE_SHAPES else (Qwen2Config, "Qwen2ForCausalLM")
    )
    config = config_cls(**sizes, max_position_embeddings=max(2048, max_model_len))
    config.architectures = [arch]
    return config


def weights_read_per_step(model: torch.nn.Module, rows: int) -> float:
    """Parameters one decode step of `rows` sequences must read: all of a dense model's; for a mixture of experts
    the dense part plus the experts that some row is routed to, in expectation X·(1 − (1 − k/X)^rows) per layer
    (uniform routing, as random weights give)."""
    config = model.config
    total = sum(p.numel() for p in model.parameters())
    num_experts = getattr(config, "num_experts", 0)
    if not num_experts:
        return float(total)
    expert = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    touched = 1 - (1 - config.num_experts_per_tok / num_experts) ** rows
    return total - expert + expert * touched


def decode_bound_seconds(model: torch.nn.Module, case: Case, dtype_bytes: int) -> float:
    """Lower bound of one mid-generation decode step: read the weights it needs and the average KV context once."""
    config = model.config
    weights = weights_read_per_step(model, case.num_prompts * case.n) * dtype_bytes
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * dtype_bytes
    rows = case.num_prompts * case.n
    avg_context = case.prompt_len + case.new_tokens / 2
    # With prefix sharing the prompt part is read once per group of n in the best case; count it per row here.
    return (weights + rows * avg_context * kv_per_token) / peak_bandwidth()


def is_main_rank() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def random_prompts(vocab_size: int, case: Case) -> list[list[int]]:
    return torch.randint(100, vocab_size - 100, (case.num_prompts, case.prompt_len)).tolist()


def run_engine(engine: LLMEngine, prompts: list[list[int]], case: Case, trace: bool = False) -> tuple[float, float]:
    """(generated tokens/s, mean decode step seconds); `trace` prints where the time went (prefill / decode)."""
    params = SamplingParams(n=case.n, temperature=1.0, max_tokens=case.new_tokens, ignore_eos=True, seed=0)
    for prompt in prompts:
        engine.add_request(prompt, params)
    decode_seconds, decode_steps = 0.0, 0
    generated = 0
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    prefill_seconds, prefill_steps = 0.0, 0
    while engine.has_unfinished_requests():
        step_start = time.perf_counter()
        for out in engine.step():
            generated += sum(len(o.token_ids) for o in out.outputs)
        if not engine.last_step_was_prefill:  # a decode window syncs at its end, so the time is the device's too
            decode_seconds += time.perf_counter() - step_start
            decode_steps += engine.last_num_steps
        else:
            sync()
            prefill_seconds, prefill_steps = prefill_seconds + time.perf_counter() - step_start, prefill_steps + 1
    sync()
    elapsed = time.perf_counter() - start
    if trace and is_main_rank():
        print(
            f"  {elapsed:.3f} s: {prefill_steps} prefill steps {prefill_seconds:.3f} s, {decode_steps} decode steps "
            f"{decode_seconds:.3f} s, other {elapsed - prefill_seconds - decode_seconds:.3f} s"
        )
    return generated / elapsed, decode_seconds / max(decode_steps, 1)


@torch.no_grad()
def run_hf(model: torch.nn.Module, prompts: list[list[int]], case: Case) -> float:
    ids = torch.tensor(prompts, device=model.device).repeat_interleave(case.n, dim=0)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        max_new_tokens=case.new_tokens,
        min_new_tokens=case.new_tokens,
        pad_token_id=0,
    )
    sync()
    return (out.shape[0] * (out.shape[1] - ids.shape[1])) / (time.perf_counter() - start)


def profile_decode(engine: LLMEngine, prompts: list[list[int]], case: Case) -> None:
    """torch.profiler over 5 engine steps (decode windows of `num_scheduler_steps` steps) mid-generation."""
    from torch.profiler import ProfilerActivity, profile

    params = SamplingParams(n=case.n, temperature=1.0, max_tokens=case.new_tokens, ignore_eos=True, seed=0)
    for prompt in prompts:
        engine.add_request(prompt, params)
    decode_steps = 0
    while decode_steps < 20 and engine.has_unfinished_requests():  # into the middle of the generation
        engine.step()
        decode_steps += 0 if engine.last_step_was_prefill else engine.last_num_steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(5):
            engine.step()
    sort_by = "cuda_time_total" if engine.device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort_by, row_limit=30, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=6, max_name_column_width=50))
    while engine.has_unfinished_requests():
        engine.step()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU")
    parser.add_argument("--shape", choices=["0.5b", "7b", "30b-a3b"], default="0.5b", help="the GPU model's shape")
    parser.add_argument("--num-layers", type=int, default=None, help="cut the shape's depth (e.g. 30b-a3b on one GPU)")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers.generate")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM")
    parser.add_argument("--cases", default="a,b", help=f"comma-separated, of {[c.name for c in GPU_CASES]}")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per case and side, after the warm-up")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument(
        "--no-fused-rope", action="store_true", help="RoPE and the KV-cache write as PyTorch ops (3 launches a layer)"
    )
    parser.add_argument(
        "--no-fused-step",
        action="store_true",
        help="end each decode-window step with PyTorch ops (sampler combine, record, advance) instead of one kernel",
    )
    parser.add_argument(
        "--no-async-scheduling", action="store_true", help="read each decode window before queueing the next one"
    )
    parser.add_argument("--profile", action="store_true", help="print a torch.profiler table of 5 decode windows")
    parser.add_argument("--trace", action="store_true", help="print the time of prefill and decode steps")
    parser.add_argument(
        "--num-scheduler-steps", type=int, default=EngineConfig.num_scheduler_steps, help="decode steps per window"
    )
    parser.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="under `torchrun --nproc-per-node N` (the engine only)"
    )
    args = parser.parse_args(argv)
    known = [c.name for c in GPU_CASES]
    unknown = [name for name in args.cases.split(",") if name not in known]
    if unknown:
        parser.error(f"--cases={args.cases}: unknown case(s) {unknown}; choose from {known}")
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: need at least 1 timed run")
    return args


def build_engine(args: argparse.Namespace, model: torch.nn.Module, max_len: int, max_rows: int) -> LLMEngine:
    """The engine under test; `max_rows` (the most sequences of a case) raises `max_num_seqs` and the CUDA-graph
    ladder above their default 512 so that a case's whole batch decodes in one graph."""
    rows = max(512, max_rows)
    config = EngineConfig(
        max_model_len=max_len,
        max_num_seqs=rows,
        cuda_graph_max_batch=rows,
        max_num_batched_tokens=16384,
        gpu_memory_utilization=0.85,
        kv_cache_bytes=2**26,
        enforce_eager=args.enforce_eager,
        num_scheduler_steps=args.num_scheduler_steps,
        async_scheduling=not args.no_async_scheduling,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    engine = LLMEngine(model, config)
    if args.no_fused_step:  # an A/B switch for this benchmark only: multi_step asks triton_step at every step
        triton_step.available = lambda: False
    if args.no_fused_rope:
        for module in engine.model.modules():
            if isinstance(module, Attention):
                module.fused_rope_cache = False
    return engine


def warmup_case(case: Case) -> Case:
    return dataclasses.replace(case, new_tokens=min(case.new_tokens, WARMUP_TOKENS))


def run_vllm_side(
    config: PretrainedConfig, cases: list[Case], prompts: dict[str, list[list[list[int]]]], max_len: int
) -> dict[str, Any]:
    """vLLM's tokens/s per case (warm-up, then one per repeat) on the same prompts, or why it did not run."""
    generator = VLLMGenerator(config, max_len)
    try:
        result: dict[str, Any] = {"version": generator.version}
        for case in cases:
            warm, *timed = prompts[case.name]
            generator.run(warm, case.n, warmup_case(case).new_tokens)
            result[case.name] = [generator.run(p, case.n, case.new_tokens) for p in timed]
            print(f"case ({case.name}) vLLM {', '.join(f'{t:,.0f}' for t in result[case.name])} tok/s", flush=True)
    finally:
        generator.close()
    return result


def spread(values: list[float], digits: int = 0, unit: str = "") -> str:
    """'v' for one value, 'lo-hi (median m)' for several."""
    if len(values) == 1:
        return f"{values[0]:,.{digits}f}{unit}"
    return f"{min(values):,.{digits}f}-{max(values):,.{digits}f}{unit} (median {statistics.median(values):,.{digits}f})"


def case_line(case: Case, hyflow: dict[str, Any], vllm: list[float] | None, hf: float | None) -> str:
    """One case's summary: the engine's tok/s and decode step over the repeats, and each baseline's ratio."""
    engine = hyflow["tokens_per_s"]
    line = (
        f"case ({case.name}) {case.num_prompts}x{case.prompt_len} n={case.n} -> {case.new_tokens}: "
        f"engine {spread(engine)} tok/s, decode step {spread([s * 1e3 for s in hyflow['step_s']], 2, ' ms')}"
    )
    if "bound_s" in hyflow:
        bound, step = hyflow["bound_s"], statistics.median(hyflow["step_s"])
        line += f" (bandwidth bound {bound * 1e3:.2f} ms, {bound / step:.0%} of it)"
    if vllm:  # the ratio of each repeat, the two sides on the same prompts
        ratios = [e / v for e, v in zip(engine, vllm)]
        line += f"; vLLM {spread(vllm)} tok/s; ratio {spread(ratios, 2, 'x')}"
    if hf is not None:
        line += f"; transformers.generate {hf:,.0f} tok/s; ratio {engine[-1] / hf:.1f}x"
    return line


def main() -> None:
    args = parse_args()
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    if args.tensor_parallel_size > 1:  # every rank runs the same engine on the same prompts (SPMD)
        if device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
        args.no_hf = args.no_vllm = True
    shape = args.shape
    if device == "cpu":  # a smoke test of the same kind of model
        shape = "tiny-moe" if shape in MOE_SHAPES else "tiny"
    cases = [c for c in (TINY_CASES if device == "cpu" else GPU_CASES) if c.name in args.cases.split(",")]
    max_len = max(c.prompt_len + c.new_tokens for c in cases)
    config = model_config(shape, max_len, args.num_layers)
    torch.manual_seed(0)  # the same weights and prompts on every rank
    # Fresh random prompts for every run (a run never finds another's prompts in the prefix cache), the same for
    # every side: the warm-up's first, then one set per repeat.
    prompts = {c.name: [random_prompts(config.vocab_size, c) for _ in range(1 + args.repeats)] for c in cases}
    result: dict[str, Any] = {"shape": shape, "device": device, "repeats": args.repeats, "cases": {}}
    skipped = "--no-vllm" if args.no_vllm else vllm_missing()
    if skipped is None:
        result["vllm"] = run_vllm_side(config, cases, prompts, max_len)
    elif is_main_rank():
        print(f"vLLM skipped: {skipped}")
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in the run's dtype: no fp32 copy of a large model at any time
    with torch.device(device):  # built in place: a 7B model's random init on the host takes minutes
        model = AutoModelForCausalLM.from_config(config).eval()
    torch.set_default_dtype(default_dtype)
    engine = build_engine(args, model, max_len, max(c.num_prompts * c.n for c in cases))
    if is_main_rank():
        print(
            f"device={device} dtype={dtype} shape={shape} "
            f"params={sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
            f"kv_blocks={engine.block_manager.num_blocks} num_scheduler_steps={engine.config.num_scheduler_steps} "
            f"async_scheduling={engine.config.async_scheduling} "
            f"tensor_parallel_size={engine.config.tensor_parallel_size}"
        )
    for case in cases:
        warm, *timed = prompts[case.name]
        run_engine(engine, warm, warmup_case(case))  # warm-up: compiles kernels, captures the CUDA graphs
        if args.profile:
            profile_case(engine, config.vocab_size, case)
        runs = [run_engine(engine, p, case, args.trace) for p in timed]
        hyflow = {"tokens_per_s": [r[0] for r in runs], "step_s": [r[1] for r in runs]}
        if device == "cuda":
            hyflow["bound_s"] = decode_bound_seconds(model, case, 2)
        hf = None if args.no_hf else run_hf(model, timed[-1], case)
        vllm = result.get("vllm", {}).get(case.name)
        result["cases"][case.name] = {"case": dataclasses.asdict(case), "hyflow": hyflow, "vllm": vllm, "hf": hf}
        if is_main_rank():
            print(case_line(case, hyflow, vllm, hf), flush=True)
    if os.environ.get("OUT") and is_main_rank():
        Path(os.environ["OUT"], f"rollout_throughput_{shape}.json").write_text(json.dumps(result) + "\n")
    if dist.is_initialized():
        engine.close()  # its CUDA graphs hold NCCL collectives: destroying the group first would hang
        dist.destroy_process_group()


def profile_case(engine: LLMEngine, vocab_size: int, case: Case) -> None:
    """torch.profiler of 5 decode windows, then cProfile of one whole run (the host's side, by Python function)."""
    import cProfile
    import pstats

    profile_decode(engine, random_prompts(vocab_size, case), case)
    with cProfile.Profile() as host_profile:
        run_engine(engine, random_prompts(vocab_size, case), case)
    pstats.Stats(host_profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
