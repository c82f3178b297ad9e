"""`GET /metrics`: the server's and the engine's state in Prometheus' text format (prometheus_client, one registry
per server).

    hyflow_requests_running / hyflow_requests_waiting     requests with a sequence running / all waiting (gauges)
    hyflow_kv_cache_usage_ratio                            used KV-cache blocks / all blocks
    hyflow_prompt_tokens_total, hyflow_generation_tokens_total    counters (tokens/s: their rate())
    hyflow_generation_tokens_per_second                   generated tokens over the last 10 s, per second
    hyflow_time_to_first_token_seconds                     histogram, streamed requests (the first chunk with text)
    hyflow_e2e_request_latency_seconds                     histogram, every request that got an answer
    hyflow_http_requests_total{endpoint, status}           counter of every answer, 500s included (limits.py)
"""

from __future__ import annotations

import collections
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hyflow.engine.engine import LLMEngine

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_WINDOW_S = 10.0


def _request_ids(queue: collections.deque) -> set[str]:
    """The request ids of a scheduler queue. `list(queue)` copies it in one C call, which the engine's step thread
    cannot interleave with (iterating the deque itself could see it change)."""
    return {seq.request_id for seq in list(queue)}


class ServerMetrics:
    def __init__(self, engine: LLMEngine) -> None:
        self.registry = registry = CollectorRegistry()
        scheduler, blocks = engine.scheduler, engine.block_manager
        Gauge("hyflow_requests_running", "requests with a sequence running", registry=registry).set_function(
            lambda: len(_request_ids(scheduler.running))
        )
        Gauge("hyflow_requests_waiting", "requests whose sequences all wait", registry=registry).set_function(
            lambda: len(_request_ids(scheduler.waiting) - _request_ids(scheduler.running))
        )
        Gauge("hyflow_kv_cache_usage_ratio", "used KV-cache blocks / all blocks", registry=registry).set_function(
            lambda: 1 - blocks.num_free_blocks / blocks.num_blocks
        )
        Gauge("hyflow_generation_tokens_per_second", "tokens over the last 10 s", registry=registry).set_function(
            self._tokens_per_second
        )
        self.prompt_tokens = Counter("hyflow_prompt_tokens", "prompt tokens of answered requests", registry=registry)
        self.generation_tokens = Counter("hyflow_generation_tokens", "generated tokens", registry=registry)
        self.ttft = Histogram(
            "hyflow_time_to_first_token_seconds", "streamed requests", buckets=_LATENCY_BUCKETS, registry=registry
        )
        self.latency = Histogram(
            "hyflow_e2e_request_latency_seconds", "answered requests", buckets=_LATENCY_BUCKETS, registry=registry
        )
        self.http_requests = Counter("hyflow_http_requests", "HTTP requests", ["endpoint", "status"], registry=registry)
        self._recent: collections.deque[tuple[float, int]] = collections.deque()

    def count_tokens(self, prompt_tokens: int, completion_tokens: int) -> None:
        """A finished engine request's tokens."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        self._recent.append((time.monotonic(), completion_tokens))

    def _tokens_per_second(self) -> float:
        cutoff = time.monotonic() - _WINDOW_S
        while self._recent and self._recent[0][0] < cutoff:
            self._recent.popleft()
        return sum(count for _, count in self._recent) / _WINDOW_S

    def render(self) -> bytes:
        return generate_latest(self.registry)
