"""The engine host's own work per decode window: microseconds of Python between and around the device's steps.

    python benchmarks/engine_host.py                      # CPU: 1024 rows x 16 prompt tokens -> 128 new, window 8
    python benchmarks/engine_host.py --rows 256 --repeats 5
    python benchmarks/engine_host.py --new-tokens 64 --digest-only   # just the outputs' digest (a before/after check)

At 1024 rows the host's part of a window (append the tokens, the stop checks, reserve the next window's slots,
build its inputs) comes close to the window's GPU time on the H200 (benchmarks/README.md, "Why batch 1024 is not
1.6x batch 256"), so it is measured here on its own, on the CPU, with a model so small that only the host's work
depends on the rows. Each decode `step()` is timed, and so are its parts, by wrapping the engine's own functions:

    take_outputs     LLMEngine._take_outputs: append each row's tokens, stop checks, finished requests
    next_window      Scheduler.schedule_next_window: the window queued behind the current one, its slot reservation
    launch_host      ModelRunner.launch less the decode steps it runs: inputs, sampling settings, the output copies
    read_outputs     in_flight.read_outputs: the window's outputs as host lists
    host             step() less the decode steps (the device's work, which on the CPU runs inside launch)

Times are the thread's CPU time (`time.thread_time`), so that other processes on a shared machine count less.
Printed: each part's mean over the decode windows of the timed run with the least host time (the first window's
scheduling and the last one's finished requests included), in microseconds, and a digest of every output (token
ids, log-probs, finish reasons): a change to the host's code must leave the digest as it was. With `$OUT` set the
numbers also go to `$OUT/engine_host.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import hyflow.engine.engine as engine_module
import hyflow.engine.model_runner as runner_module
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.sequence import RequestOutput

PARTS = ("take_outputs", "next_window", "launch_host", "read_outputs", "host")
MICRO_SHAPE = dict(  # the host's work depends on rows and tokens, not on the model: the smallest decoder
    vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=1, tie_word_embeddings=True,
)  # fmt: skip


class WindowTimer:
    """Seconds spent in each wrapped function during the current `step()`, and the device's (decode steps)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[name] += time.thread_time() - start

        return timed


def build_engine(rows: int, max_len: int, num_scheduler_steps: int) -> LLMEngine:
    """The engine under test: the micro model on the CPU (eager), room for `rows` sequences of `max_len` tokens."""
    torch.manual_seed(0)
    config = Qwen2Config(**MICRO_SHAPE, max_position_embeddings=max_len)
    config.architectures = ["Qwen2ForCausalLM"]
    engine_config = EngineConfig(
        device="cpu",
        max_model_len=max_len,
        max_num_seqs=rows,
        max_num_batched_tokens=max(8192, rows * max_len),
        kv_cache_bytes=2**27,
        num_scheduler_steps=num_scheduler_steps,
    )
    return LLMEngine(Qwen2ForCausalLM(config).eval(), engine_config)


@contextlib.contextmanager
def instrumented(engine: LLMEngine) -> Iterator[WindowTimer]:
    """Times the engine's host functions with a `WindowTimer`; the module functions it wraps are restored on exit."""
    timer = WindowTimer()
    engine._take_outputs = timer.wrap("take_outputs", engine._take_outputs)
    engine.scheduler.schedule_next_window = timer.wrap("next_window", engine.scheduler.schedule_next_window)
    engine.in_flight.launch = timer.wrap("launch", engine.in_flight.launch)
    read_outputs, decode_step = engine_module.read_outputs, runner_module.decode_step
    engine_module.read_outputs = timer.wrap("read_outputs", read_outputs)
    runner_module.decode_step = timer.wrap("device", decode_step)
    try:
        yield timer
    finally:
        engine_module.read_outputs, runner_module.decode_step = read_outputs, decode_step


def outputs_digest(outputs: list[RequestOutput]) -> str:
    """A digest of every sample's token ids, log-probs and finish reason, in the order given."""
    digest = hashlib.sha256()
    for output in outputs:
        for sample in output.outputs:
            digest.update(json.dumps([sample.token_ids, sample.log_probs, sample.finish_reason]).encode())
    return digest.hexdigest()[:16]


def run(engine: LLMEngine, timer: WindowTimer, prompts: list[list[int]], params: SamplingParams) -> tuple[dict, str]:
    """Generates for `prompts`; (per part, the microseconds of each decode window), the outputs' digest."""
    ids = [engine.add_request(prompt, params) for prompt in prompts]
    windows: dict[str, list[float]] = defaultdict(list)
    outputs = {}
    while engine.has_unfinished_requests():
        timer.parts.clear()
        start = time.thread_time()
        finished = engine.step()
        total = time.thread_time() - start
        outputs.update({out.request_id: out for out in finished})
        if engine.last_step_was_prefill:
            continue
        parts = timer.parts
        parts["launch_host"] = parts["launch"] - parts["device"]
        parts["host"] = total - parts["device"]
        for name in PARTS:
            windows[name].append(parts[name] * 1e6)
    return windows, outputs_digest([outputs[request_id] for request_id in ids])


def random_prompts(rows: int, prompt_len: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(3, MICRO_SHAPE["vocab_size"], (rows, prompt_len), generator=generator).tolist()


def benchmark_params(new_tokens: int) -> SamplingParams:
    """Seeded sampling at temperature 1, every row to `new_tokens` (as rollout_throughput.py's cases)."""
    return SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True, seed=0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1024, help="prompts (one sample each): the decode batch")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--num-scheduler-steps", type=int, default=8, help="decode steps per window")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs, after one warm-up run")
    parser.add_argument("--digest-only", action="store_true", help="one run, print only the outputs' digest")
    args = parser.parse_args(argv)
    if min(args.rows, args.prompt_len, args.new_tokens, args.repeats) < 1:
        parser.error("--rows, --prompt-len, --new-tokens and --repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    max_len = args.prompt_len + args.new_tokens
    prompts = random_prompts(args.rows, args.prompt_len)
    params = benchmark_params(args.new_tokens)
    engine = build_engine(args.rows, max_len, args.num_scheduler_steps)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the host's work is single-threaded; one thread keeps the device part steady too
    try:
        with instrumented(engine) as timer:
            result = measure(engine, timer, prompts, params, args)
    finally:
        torch.set_num_threads(threads)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "engine_host.json").write_text(json.dumps(result) + "\n")
    return result


def measure(
    engine: LLMEngine, timer: WindowTimer, prompts: list[list[int]], params: SamplingParams, args: argparse.Namespace
) -> dict[str, Any]:
    """The digest of one run (`--digest-only`), or a warm-up and `--repeats` timed runs, printed."""
    if args.digest_only:
        _, digest = run(engine, timer, prompts, params)
        print(f"digest {digest}")
        return {"digest": digest}
    run(engine, timer, prompts, params)  # warm-up
    runs, digests = [], set()
    for _ in range(args.repeats):
        windows, digest = run(engine, timer, prompts, params)
        digests.add(digest)
        runs.append({name: statistics.fmean(windows[name]) for name in PARTS})
    if len(digests) != 1:
        raise RuntimeError(f"the same prompts gave different outputs run to run: digests {sorted(digests)}")
    best = min(runs, key=lambda parts: parts["host"])
    result = {"rows": args.rows, "us_per_window": best, "host_us_per_run": [r["host"] for r in runs]}
    result["digest"] = digests.pop()
    print(
        f"{args.rows} rows, window {args.num_scheduler_steps}, best of {args.repeats} runs: "
        + ", ".join(f"{name} {value:,.0f}" for name, value in best.items())
        + f" us per window; host per run {', '.join(f'{h:,.0f}' for h in result['host_us_per_run'])} us; "
        f"outputs digest {result['digest']}"
    )
    return result


if __name__ == "__main__":
    main()
