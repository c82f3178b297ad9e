"""`hyflow serve` under concurrency: throughput, time to first token and inter-token latency, next to the engine's
own offline throughput on the same prompts and (where `vllm` is importable) vLLM's OpenAI server.

    python benchmarks/serve_throughput.py                      # GPU: Qwen2-0.5B shape, 256 requests 256 -> 256
    python benchmarks/serve_throughput.py --shape 7b --num-requests 128
    python benchmarks/serve_throughput.py --shape tiny --num-requests 16 --prompt-len 16 --max-tokens 8   # CPU

What one run does, each side on the same random prompts (token ids, so no tokenizer shapes the work):
1. writes a model folder of the shape (`shapes.py`) with random weights and a word-level tokenizer of the shape's
   vocabulary (every id decodes to a word, so every streamed token is a visible delta on both servers);
2. starts `python -m hyflow serve --model FOLDER` as a subprocess, waits for `/health`, sends one 4-token warm-up
   request per prompt on other random prompts (so the burst gets no prefix-cache hits), then fires
   `--num-requests` streaming `/v1/completions` requests from `--client-processes` processes (4; each an asyncio
   loop on httpx, the events parsed with `json.loads`: a single Python client, or the `openai` client's pydantic
   parse of every chunk, can cost more than a fast server's work and cap what is measured), at most
   `--concurrency` in flight (default: all at once): temperature 1, `ignore_eos`, exactly `--max-tokens` new
   tokens, `logprobs=0` (the sampled token's log-prob, which RL needs), `stream_options.include_usage`;
3. the engine offline (`LLMEngine.generate`, one call over all prompts, after a 4-token warm-up), in this process
   once the server has exited (so each side has the device to itself);
4. with `vllm` importable (and CUDA), `python -m vllm.entrypoints.openai.api_server` on the same folder with the
   settings of `rollout_throughput_vllm.py` (prefix caching, `max_num_seqs`), the same requests; ratios printed.

Per request: TTFT = time from sending to the first chunk with a token; inter-token latency (ITL) = the gap between
consecutive chunks, shared evenly by the tokens a chunk carries (hyflow's multi-step decode can stream several
tokens per chunk; the count comes from the chunk's log-probs). Throughput = all generated tokens over the wall time
of the whole burst. Percentiles p50/p90/p99 are over all requests (TTFT) and all tokens (ITL). Server CPU = the
user + system CPU time of hyflow's server process (every thread: HTTP, streaming, the engine's host side) over
the burst, per generated token: the host cost, which a loaded machine's wall clock hides.
With `$OUT` set, the numbers also go to `$OUT/serve_throughput_<shape>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shapes import SHAPES  # this script's folder

MODEL_NAME = "bench"


@dataclass
class RequestStats:
    ttft_s: float = float("nan")
    token_gaps_s: list[float] = field(default_factory=list)  # one per token after the first chunk
    num_tokens: int = 0


def word_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer with exactly `vocab_size` ids: id 0 is `<|endoftext|>`, id i the word `w<i>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def build_model_folder(shape: str, folder: Path, max_model_len: int) -> Path:
    """config.json, random weights (bf16 on CUDA, fp32 on CPU) and the word-level tokenizer of `shape`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=max(2048, max_model_len))
    config.architectures = ["Qwen2ForCausalLM"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(folder)
    word_tokenizer(config.vocab_size).save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # the servers start in other processes and need the memory
    return folder


class ServerProcess:
    """An OpenAI-compatible server started as a subprocess (its log in `log_path`), stopped on exit."""

    def __init__(self, command: list[str], port: int, log_path: Path, timeout_s: float) -> None:
        self.command, self.port, self.log_path, self.timeout_s = command, port, log_path, timeout_s
        self.base_url = f"http://127.0.0.1:{port}/v1"

    def __enter__(self) -> ServerProcess:
        import httpx

        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._log.close()
                raise RuntimeError(f"{self.command[:4]} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"no /health on port {self.port} within {self.timeout_s:.0f} s:\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the server process has used so far (all its threads; Linux's /proc)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def log_tail(self, num_chars: int = 3000) -> str:
        """The end of the server's log (the folder may be a temporary one, gone once the error is read)."""
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


async def one_request(http: Any, base_url: str, prompt: list[int], max_tokens: int) -> RequestStats:
    """One streamed completion, read as raw server-sent events; its TTFT, per-token gaps and token count."""
    body = {
        "model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "logprobs": 0,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
    }  # fmt: skip
    stats, start = RequestStats(), time.perf_counter()
    last = start
    async with http.stream("POST", f"{base_url}/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices")
            logprobs = choices[0].get("logprobs") if choices else None
            count = len(logprobs.get("tokens") or []) if logprobs else 0
            if count == 0:
                continue
            now = time.perf_counter()
            gap = (now - start if stats.num_tokens == 0 else now - last) / count
            if stats.num_tokens == 0:
                stats.ttft_s = now - start
                stats.token_gaps_s += [gap] * (count - 1)  # the first token's time is its TTFT
            else:
                stats.token_gaps_s += [gap] * count
            stats.num_tokens += count
            last = now
    return stats


async def send_all(base_url: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> list[RequestStats]:
    """All prompts' requests, at most `concurrency` in flight."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(3600.0)) as http:
        gate = asyncio.Semaphore(concurrency)

        async def gated(prompt: list[int]) -> RequestStats:
            async with gate:
                return await one_request(http, base_url, prompt, max_tokens)

        return list(await asyncio.gather(*(gated(p) for p in prompts)))


def client_process(base_url: str, prompts: list, max_tokens: int, concurrency: int, barrier: Any, results: Any) -> None:
    """One client process: wait for the others (so all start together), send, report (start, end, stats)."""
    barrier.wait()
    start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of this machine
    stats = asyncio.run(send_all(base_url, prompts, max_tokens, concurrency))
    results.put((start, time.monotonic(), stats))


def burst(
    base_url: str, prompts: list[list[int]], max_tokens: int, concurrency: int, procs: int
) -> tuple[list[RequestStats], float]:
    """All prompts' requests from `procs` client processes (prompts and concurrency dealt out evenly): (per-request
    stats, wall seconds from the first process's start to the last one's end)."""
    import multiprocessing

    if procs == 1:
        start = time.monotonic()
        stats = asyncio.run(send_all(base_url, prompts, max_tokens, concurrency))
        return stats, time.monotonic() - start
    context = multiprocessing.get_context("spawn")  # this process may hold a CUDA context
    barrier, results = context.Barrier(procs), context.Queue()
    shares = [(prompts[i::procs], max(1, concurrency // procs)) for i in range(procs)]
    workers = [
        context.Process(target=client_process, args=(base_url, share, max_tokens, limit, barrier, results))
        for share, limit in shares
    ]
    for worker in workers:
        worker.start()
    reports = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    wall = max(end for _, end, _ in reports) - min(start for start, _, _ in reports)
    return [stat for _, _, stats in reports for stat in stats], wall


def percentiles(values: list[float]) -> dict[str, float]:
    """p50/p90/p99 in milliseconds (`statistics.quantiles`, inclusive method)."""
    if len(values) < 2:
        values = values * 2 or [float("nan")] * 2
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {f"p{q}_ms": 1000 * cuts[q - 1] for q in (50, 90, 99)}


def summarize(stats: list[RequestStats], wall_s: float, max_tokens: int) -> dict[str, Any]:
    tokens = sum(s.num_tokens for s in stats)
    short = [i for i, s in enumerate(stats) if s.num_tokens != max_tokens]
    if short:  # ignore_eos: every request must do the same work, or the sides are not comparable
        raise RuntimeError(f"{len(short)} requests streamed other than {max_tokens} tokens (first: #{short[0]})")
    return {
        "tok_s": tokens / wall_s,
        "wall_s": wall_s,
        "ttft": percentiles([s.ttft_s for s in stats]),
        "itl": percentiles([gap for s in stats for gap in s.token_gaps_s]),
    }


def offline_tok_s(
    folder: Path, prompts: list[list[int]], warmup: list[list[int]], max_tokens: int, max_num_seqs: int, max_len: int
) -> float:
    """Generated tokens/s of one `LLMEngine.generate` over all prompts, after one over the warm-up prompts."""
    from transformers import AutoTokenizer

    from hyflow.engine.config import EngineConfig, SamplingParams
    from hyflow.engine.engine import LLMEngine

    config = EngineConfig(max_model_len=max_len, max_num_seqs=max_num_seqs, gpu_memory_utilization=0.8)
    engine = LLMEngine(str(folder), config, AutoTokenizer.from_pretrained(folder))
    engine.generate(warmup, SamplingParams(max_tokens=4, ignore_eos=True))
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return sum(len(out.outputs[0].token_ids) for out in outputs) / elapsed


def vllm_missing() -> str | None:
    """Why vLLM's server cannot run here, or None."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("vllm") is None:
        return "vllm not importable (see benchmarks/README.md for putting vLLM 0.25 on PYTHONPATH)"
    return None


def server_commands(args: argparse.Namespace, folder: Path, max_len: int) -> dict[str, list[str]]:
    hyflow = [sys.executable, "-m", "hyflow", "serve", "--model", str(folder), "--port", str(args.port),
              "--served-model-name", MODEL_NAME, "--max-model-len", str(max_len),
              "--max-num-seqs", str(args.max_num_seqs)]  # fmt: skip
    vllm = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
            "--port", str(args.port), "--served-model-name", MODEL_NAME, "--max-model-len", str(max_len),
            "--max-num-seqs", str(args.max_num_seqs), "--enable-prefix-caching", "--dtype", "bfloat16",
            "--gpu-memory-utilization", "0.8", "--seed", "0"]  # fmt: skip
    return {"hyflow": hyflow, "vllm": vllm}


def side_line(name: str, result: dict[str, Any]) -> str:
    ttft, itl = result["ttft"], result["itl"]
    cpu = result.get("server_cpu_us_per_token")
    return (
        f"{name:<16} {result['tok_s']:>10,.0f} tok/s   TTFT p50/p90/p99 {ttft['p50_ms']:.1f}/{ttft['p90_ms']:.1f}/"
        f"{ttft['p99_ms']:.1f} ms   ITL p50/p90/p99 {itl['p50_ms']:.2f}/{itl['p90_ms']:.2f}/{itl['p99_ms']:.2f} ms"
        + (f"   server CPU {cpu:.0f} us/token" if cpu is not None else "")
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=None, help="requests in flight (default: all)")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument(
        "--client-processes", type=int, default=4, help="processes sending the requests (one asyncio loop each)"
    )
    parser.add_argument("--port", type=int, default=8471)
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM's server even where it is importable")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="seconds a server may take to start")
    parser.add_argument("--folder", default=None, help="where to write the model (default: a temporary folder)")
    args = parser.parse_args(argv)
    for name in ("num_requests", "client_processes", "prompt_len", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    return args


def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    max_len = args.prompt_len + args.max_tokens + 16
    build_model_folder(args.shape, folder, max_len)
    rng = random.Random(0)
    vocab = int(SHAPES[args.shape]["vocab_size"])
    prompts, warmup = (
        [[rng.randrange(1, vocab) for _ in range(args.prompt_len)] for _ in range(count)]
        for count in (args.num_requests, args.num_requests)  # other prompts warm up: no prefix-cache hits later
    )
    concurrency = args.concurrency or args.num_requests
    commands = server_commands(args, folder, max_len)
    sides = ["hyflow"]
    reason = None if not args.no_vllm else "--no-vllm"
    reason = reason or vllm_missing()
    if reason is None:
        sides.append("vllm")
    else:
        print(f"vLLM's server skipped: {reason}", flush=True)
    results: dict[str, Any] = {"shape": args.shape, "num_requests": args.num_requests, "concurrency": concurrency,
                               "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
                               "client_processes": args.client_processes}  # fmt: skip
    if "vllm" in sides:
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is not in the packed vLLM build
    for side in sides:
        with ServerProcess(commands[side], args.port, folder / f"{side}_server.log", args.start_timeout) as server:
            asyncio.run(send_all(server.base_url, warmup, 4, len(warmup)))  # 4 tokens each, from this process
            cpu_before = server.cpu_seconds()
            stats, wall = burst(server.base_url, prompts, args.max_tokens, concurrency, args.client_processes)
            cpu_s = server.cpu_seconds() - cpu_before
        results[side] = summarize(stats, wall, args.max_tokens)
        if side == "hyflow":  # one process; vLLM's engine core runs in another, which this would not count
            results[side]["server_cpu_us_per_token"] = 1e6 * cpu_s / (args.num_requests * args.max_tokens)
        print(side_line(f"{side} server", results[side]), flush=True)
    offline = offline_tok_s(folder, prompts, warmup, args.max_tokens, args.max_num_seqs, max_len)
    results["offline_tok_s"] = offline
    print(f"{'engine offline':<16} {results['offline_tok_s']:>10,.0f} tok/s", flush=True)
    print(f"hyflow server / engine offline: {results['hyflow']['tok_s'] / results['offline_tok_s']:.2f}x")
    if "vllm" in results:
        print(f"hyflow server / vLLM server: {results['hyflow']['tok_s'] / results['vllm']['tok_s']:.2f}x tok/s")
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    concurrency = args.concurrency or args.num_requests
    print(f"serve_throughput: shape={args.shape} requests={args.num_requests} concurrency={concurrency} "
          f"{args.prompt_len} -> {args.max_tokens} tokens", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="hyflow_bench_serve_") as scratch:
        results = run(args, Path(args.folder or scratch))
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / f"serve_throughput_{args.shape}.json"
        path.write_text(json.dumps(results, indent=2))
        print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
