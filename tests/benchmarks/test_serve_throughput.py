"""benchmarks/serve_throughput.py on the CPU with the tiny shape: `hyflow serve` starts as a subprocess, every
streamed request gets exactly its tokens, and the report has throughput, TTFT and ITL percentiles and the engine's
offline tok/s."""

from __future__ import annotations

import math
import socket
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def serve_throughput(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import serve_throughput

    yield serve_throughput
    sys.modules.pop("serve_throughput", None)


def test_the_word_tokenizer_decodes_every_id_of_the_shapes_vocabulary(serve_throughput):
    tokenizer = serve_throughput.word_tokenizer(600)
    assert len(tokenizer) == 600 and tokenizer.eos_token_id == 0
    assert tokenizer.decode([5, 599]) == "w5 w599" and tokenizer.encode("w5 w599") == [5, 599]


def test_a_server_that_exits_at_start_is_an_error_with_the_end_of_its_log(serve_throughput, tmp_path):
    command = [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"]
    server = serve_throughput.ServerProcess(command, free_port(), tmp_path / "server.log", timeout_s=60)
    with pytest.raises(RuntimeError, match=r"exited with 3:\nno model here"):
        server.__enter__()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_benchmark_reports_server_and_offline_throughput_on_the_tiny_shape(serve_throughput, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    argv = ["--shape", "tiny", "--num-requests", "6", "--prompt-len", "8", "--max-tokens", "5", "--no-vllm",
            "--client-processes", "2"]  # fmt: skip
    results = serve_throughput.main([*argv, "--port", str(free_port()), "--folder", str(tmp_path / "model")])
    served = results["hyflow"]
    assert served["tok_s"] > 0 and results["offline_tok_s"] > 0 and served["server_cpu_us_per_token"] > 0
    for metric in ("ttft", "itl"):
        p50, p90, p99 = (served[metric][f"p{q}_ms"] for q in (50, 90, 99))
        assert math.isfinite(p99) and 0 < p50 <= p90 <= p99
    assert "vllm" not in results and (tmp_path / "serve_throughput_tiny.json").exists()
    assert results["num_requests"] == 6 and results["client_processes"] == 2
    assert (tmp_path / "model" / "hyflow_server.log").exists()
