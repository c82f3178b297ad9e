"""`search`: asks a retrieval service over HTTP for the passages that best match a query.

The service speaks the Search-R1 / verl retrieval protocol, which `hyflow serve-retrieval` implements:

    POST {retrieval_service_url}   {"queries": ["..."], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": {"id": "...", "contents": "title\\ntext"}, "score": 7.1}, ...]]}

At most `num_workers` requests are in flight at once and at most `rate_limit` start per second, shared by every
episode that uses this tool (threading primitives, held in the request's thread: each tool call runs on an event
loop of its own, hyflow/agent/tools/hook_runner.py); a request that takes longer than `timeout` seconds becomes an
error message.

    tools:
      - class_name: search
        config: {retrieval_service_url: "http://127.0.0.1:8000/retrieve", topk: 3, timeout: 10}
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from hyflow.agent.tools.base import BaseTool, ToolConfig, ToolResponse

logger = logging.getLogger(__name__)


@dataclass
class SearchToolConfig(ToolConfig):
    retrieval_service_url: str = "http://127.0.0.1:8000/retrieve"
    num_workers: int = 4  # requests in flight at once
    rate_limit: float = 20.0  # requests started per second
    topk: int = 3  # passages per query

    def __post_init__(self) -> None:
        for key in ("num_workers", "rate_limit", "topk", "timeout"):
            if getattr(self, key) <= 0:
                raise ValueError(f"search tool config {key}={getattr(self, key)!r} must be > 0")


class RateLimiter:
    """Spaces request starts at least `1 / rate` seconds apart (a one-slot token bucket), across threads."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self._next_start = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        """Block the calling thread until the next start is due."""
        with self._lock:
            now = time.monotonic()
            delay = self._next_start - now
            self._next_start = max(now, self._next_start) + self.interval
        if delay > 0:
            time.sleep(delay)


def post_json(url: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    """POST a JSON body and parse the JSON answer (blocking; run it in a thread)."""
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read().decode())


def format_passages(hits: list[dict[str, Any]]) -> str:
    """Numbered passages, `Doc i (Title: first line) rest`, as Search-R1 shows them to the model."""
    lines = []
    for i, hit in enumerate(hits, start=1):
        contents = str(hit.get("document", {}).get("contents", ""))
        title, _, text = contents.partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text}".rstrip())
    return "\n".join(lines) if lines else "No results."


class SearchTool(BaseTool):
    """Retrieve passages for a query from the configured retrieval service."""

    config_class = SearchToolConfig
    default_schema = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search a document collection and return the most relevant passages.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what to look for"}},
                "required": ["query"],
            },
        },
    }

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None) -> None:
        super().__init__(config, tool_schema)
        self._slots = threading.BoundedSemaphore(self.config.num_workers)
        self._limiter = RateLimiter(self.config.rate_limit)

    def _post_throttled(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One request, in its own thread, within the tool's concurrency and rate limits (whatever loop asked)."""
        with self._slots:
            self._limiter.wait()
            return post_json(self.config.retrieval_service_url, payload, self.config.timeout)

    async def search(self, query: str) -> list[dict[str, Any]]:
        """The top-k hits for one query, as the service returned them."""
        payload = {"queries": [query], "topk": self.config.topk, "return_scores": True}
        answer = await asyncio.to_thread(self._post_throttled, payload)
        return answer["result"][0]

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        query = str(parameters.get("query", "")).strip()
        if not query:
            return ToolResponse(text="Error: the query is empty."), 0.0, {"ok": False}
        try:
            hits = await self.search(query)
        except (OSError, urllib.error.URLError, ValueError, KeyError, IndexError) as error:
            logger.warning("search tool: request to %s failed: %s", self.config.retrieval_service_url, error)
            return ToolResponse(text=f"Error: the search service failed ({error})."), 0.0, {"ok": False}
        return ToolResponse(text=format_passages(hits)), 0.0, {"ok": True, "num_hits": len(hits)}
