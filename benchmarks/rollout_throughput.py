"""Generation throughput of hyflow's engine next to `transformers.generate`, on random-weight models.

    python benchmarks/rollout_throughput.py              # GPU: Qwen2-0.5B shape, bf16, cases (a) and (b)
    python benchmarks/rollout_throughput.py --tiny       # CPU: a tiny model, small shapes (minutes on a laptop)
    python benchmarks/rollout_throughput.py --no-hf      # engine only
    python benchmarks/rollout_throughput.py --no-hf --num-scheduler-steps 1   # one host round trip per token
    python benchmarks/rollout_throughput.py --no-hf --no-async-scheduling     # no window queued ahead
    torchrun --nproc-per-node 2 benchmarks/rollout_throughput.py --tensor-parallel-size 2   # the engine, TP=2

Cases: (a) 256 prompts x 256 prompt tokens -> 256 new tokens each (ignore_eos);
       (b) GRPO shape: 64 prompts x 512 prompt tokens, n=8, 512 new tokens (the 8 samples share the prompt's cache);
       (c) the generation of benchmarks/grpo_step.py: 8 prompts x 64 tokens, n=8, 256 new tokens (`--cases a,b,c`).
For the engine it also prints the mean decode step time (a multi-step decode window counts as its number of steps)
next to the memory-bandwidth bound of that step (weights + the KV cache read once per step, over the device's peak
bandwidth).
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from hyflow.engine import triton_step
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.models.llama import Attention

H200_BANDWIDTH = 4.8e12  # bytes/s, HBM3e peak


@dataclass
class Case:
    name: str
    num_prompts: int
    prompt_len: int
    n: int
    new_tokens: int


GPU_CASES = [Case("a", 256, 256, 1, 256), Case("b", 64, 512, 8, 512), Case("c", 8, 64, 8, 256)]
TINY_CASES = [Case("a", 32, 32, 1, 32), Case("b", 8, 64, 8, 64), Case("c", 4, 16, 4, 32)]


def qwen2_config(tiny: bool) -> Qwen2Config:
    if tiny:
        sizes = dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    else:  # Qwen2-0.5B
        sizes = dict(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
        )
    config = Qwen2Config(**sizes, max_position_embeddings=2048, tie_word_embeddings=True)
    config.architectures = ["Qwen2ForCausalLM"]
    return config


def decode_bound_seconds(model: torch.nn.Module, case: Case, dtype_bytes: int) -> float:
    """Lower bound of one mid-generation decode step: read all weights and the average KV context once."""
    config = model.config
    weights = sum(p.numel() for p in model.parameters()) * dtype_bytes
    head_dim = config.hidden_size // config.num_attention_heads
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * dtype_bytes
    rows = case.num_prompts * case.n
    avg_context = case.prompt_len + case.new_tokens / 2
    # With prefix sharing the prompt part is read once per group of n in the best case; count it per row here.
    return (weights + rows * avg_context * kv_per_token) / H200_BANDWIDTH


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers.generate")
    parser.add_argument("--cases", default="a,b")
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
    args = parser.parse_args()
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    if args.tensor_parallel_size > 1:  # every rank runs the same engine on the same prompts (SPMD)
        if device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
        args.no_hf = True
    torch.manual_seed(0)  # the same weights and prompts on every rank
    model = Qwen2ForCausalLM(qwen2_config(args.tiny)).to(device=device, dtype=dtype).eval()
    cases = [c for c in (TINY_CASES if args.tiny else GPU_CASES) if c.name in args.cases.split(",")]
    max_len = max(c.prompt_len + c.new_tokens for c in cases)
    config = EngineConfig(
        max_model_len=max_len,
        max_num_seqs=512,
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
    if is_main_rank():
        print(
            f"device={device} dtype={dtype} params={sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
            f"kv_blocks={engine.block_manager.num_blocks} num_scheduler_steps={config.num_scheduler_steps} "
            f"async_scheduling={config.async_scheduling} "
            f"tensor_parallel_size={config.tensor_parallel_size}"
        )
    for case in cases:
        # New random prompts for every run: a run never finds the previous run's prompts in the prefix cache.
        fresh_prompts = functools.partial(random_prompts, model.config.vocab_size, case)
        run_engine(engine, fresh_prompts(), case)  # warm-up: compiles kernels, captures the CUDA graphs
        run_engine(engine, fresh_prompts(), case)
        if args.profile:
            profile_decode(engine, fresh_prompts(), case)
            import cProfile  # the host's side of one whole run, by Python function
            import pstats

            with cProfile.Profile() as host_profile:
                run_engine(engine, fresh_prompts(), case)
            pstats.Stats(host_profile).sort_stats("tottime").print_stats(18)
        prompts = fresh_prompts()
        tokens_per_s, step_s = run_engine(engine, prompts, case, args.trace)
        line = (
            f"case ({case.name}) {case.num_prompts}x{case.prompt_len} n={case.n} -> {case.new_tokens}: "
            f"engine {tokens_per_s:,.0f} tok/s, decode step {step_s * 1e3:.2f} ms"
        )
        if device == "cuda":
            bound = decode_bound_seconds(model, case, 2)
            line += f" (bandwidth bound {bound * 1e3:.2f} ms, {bound / step_s:.0%} of it)"
        if not args.no_hf:
            hf_tokens_per_s = run_hf(model, prompts, case)
            line += f"; transformers.generate {hf_tokens_per_s:,.0f} tok/s; ratio {tokens_per_s / hf_tokens_per_s:.1f}x"
        if is_main_rank():
            print(line, flush=True)
    if dist.is_initialized():
        engine.close()  # its CUDA graphs hold NCCL collectives: destroying the group first would hang
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
