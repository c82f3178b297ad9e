"""The search tool against a real retrieval server on loopback: results, throttling, and failures as text."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time

import pytest

from hyflow.agent.retrieval_server import BM25Index, RetrievalServer
from hyflow.agent.tools import search as search_module
from hyflow.agent.tools.search import RateLimiter, SearchTool, format_passages

pytestmark = pytest.mark.timeout(60)

DOCUMENTS = [
    {"id": "0", "contents": "Mount Everest\nEverest is the highest mountain above sea level."},
    {"id": "1", "contents": "K2\nK2 is the second-highest mountain on Earth."},
    {"id": "2", "contents": "Nile\nThe Nile is a major river in northeastern Africa."},
]


@pytest.fixture(scope="module")
def service():
    server = RetrievalServer(BM25Index(DOCUMENTS), port=0).start()
    yield f"{server.url}/retrieve"
    server.close()


def test_search_returns_numbered_passages_from_the_service(service):
    tool = SearchTool(config={"retrieval_service_url": service, "topk": 2})
    response, reward, metrics = asyncio.run(tool.execute("i", {"query": "Everest, the highest mountain"}))
    first, second = response.text.splitlines()
    assert first == "Doc 1(Title: Mount Everest) Everest is the highest mountain above sea level."
    assert second.startswith("Doc 2(Title: K2)")
    assert reward == 0.0 and metrics == {"ok": True, "num_hits": 2}


def test_concurrent_searches_respect_the_rate_limit(service):
    tool = SearchTool(config={"retrieval_service_url": service, "rate_limit": 10, "num_workers": 4})

    async def many():
        start = time.monotonic()
        await asyncio.gather(*(tool.search("river") for _ in range(4)))
        return time.monotonic() - start

    assert asyncio.run(many()) >= 0.3  # four starts at least 0.1 s apart


def test_rate_limiter_spaces_request_starts():
    limiter = RateLimiter(rate=20)
    times = []
    for _ in range(3):
        limiter.wait()
        times.append(time.monotonic())
    assert all(b - a >= 0.045 for a, b in itertools.pairwise(times))


def test_num_workers_bounds_requests_in_flight_across_event_loops(monkeypatch):
    # Each tool call runs on an event loop of its own (hook_runner), so the bound must hold across loops.
    tool = SearchTool(config={"retrieval_service_url": "http://unused", "num_workers": 2, "rate_limit": 1000})
    lock, in_flight, peak = threading.Lock(), [0], [0]
    all_started = threading.Barrier(2, timeout=5)

    def fake_post(url, payload, timeout):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        with contextlib.suppress(threading.BrokenBarrierError):
            all_started.wait()  # the first two meet here; a third one in flight would break the bound
        time.sleep(0.05)
        with lock:
            in_flight[0] -= 1
        return {"result": [[]]}

    monkeypatch.setattr(search_module, "post_json", fake_post)
    threads = [threading.Thread(target=asyncio.run, args=(tool.search("q"),)) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] == 2


def test_an_unreachable_service_and_an_empty_query_become_error_messages():
    tool = SearchTool(config={"retrieval_service_url": "http://127.0.0.1:9/retrieve", "timeout": 2})
    response, _, metrics = asyncio.run(tool.execute("i", {"query": "anything"}))
    assert response.text.startswith("Error: the search service failed") and metrics == {"ok": False}
    response, _, _ = asyncio.run(tool.execute("i", {"query": "  "}))
    assert response.text == "Error: the query is empty."


def test_format_passages_handles_no_results():
    assert format_passages([]) == "No results."
    assert format_passages(json.loads('[{"document": {"contents": "T\\nbody"}}]')) == "Doc 1(Title: T) body"
