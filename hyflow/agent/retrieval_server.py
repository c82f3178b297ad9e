"""`hyflow serve-retrieval`: a local BM25 retrieval service for the `search` tool.

    hyflow serve-retrieval --corpus wiki.jsonl --host 127.0.0.1 --port 8000 [--topk 3]

The corpus is JSONL, one document per line: `{"id": "...", "contents": "title\\ntext"}` (Search-R1's format), or
`{"title": ..., "text": ...}`, or `{"text": ...}`. It is indexed in memory with `bm25s` (English stopwords removed).
The HTTP API is the one the `search` tool speaks:

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}
      -> {"result": [[{"document": {"id": "...", "contents": "..."}, "score": 7.1}, ...], ...]}
    GET  /health    -> {"status": "ok", "num_documents": N}

Documents that share no term with the query (score 0) are left out, so a result list may be shorter than topk.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger(__name__)

MAX_QUERIES_PER_REQUEST = 256
MAX_TOPK = 100


def load_corpus(path: str | os.PathLike) -> list[dict[str, str]]:
    """Documents `{"id", "contents"}` from a JSONL file; a ValueError names the bad line."""
    documents = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"--corpus {os.fspath(path)!r} line {number} is not JSON: {error}") from error
            if not isinstance(row, dict) or not any(key in row for key in ("contents", "text")):
                raise ValueError(
                    f"--corpus {os.fspath(path)!r} line {number} needs a 'contents' or 'text' field "
                    '(e.g. {"id": "0", "contents": "Title\\nText"}).'
                )
            contents = row.get("contents") or (f"{row['title']}\n{row['text']}" if row.get("title") else row["text"])
            documents.append({"id": str(row.get("id", number - 1)), "contents": str(contents)})
    if not documents:
        raise ValueError(f"--corpus {os.fspath(path)!r} holds no documents.")
    return documents


class BM25Index:
    """An in-memory BM25 index (bm25s) over documents; `search` is safe to call from several threads."""

    def __init__(self, documents: list[dict[str, str]]) -> None:
        import bm25s

        self._bm25s = bm25s
        self.documents = documents
        tokens = bm25s.tokenize([doc["contents"] for doc in documents], stopwords="en", show_progress=False)
        self.retriever = bm25s.BM25()
        self.retriever.index(tokens, show_progress=False)
        self._lock = threading.Lock()

    def search(self, queries: list[str], topk: int) -> list[list[tuple[dict[str, str], float]]]:
        """For each query, up to `topk` (document, score) pairs, best first, score > 0."""
        k = min(topk, len(self.documents))
        query_tokens = self._bm25s.tokenize(queries, stopwords="en", show_progress=False, return_ids=False)
        with self._lock:
            indices, scores = self.retriever.retrieve(query_tokens, k=k, show_progress=False, n_threads=0)
        return [
            [(self.documents[int(i)], float(s)) for i, s in zip(row_indices, row_scores) if s > 0]
            for row_indices, row_scores in zip(indices, scores)
        ]


def parse_request(body: bytes, default_topk: int) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) from a /retrieve body; a ValueError says what is wrong."""
    request = json.loads(body or b"{}")
    if not isinstance(request, dict):
        raise ValueError("the body must be a JSON object")
    queries = request.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError('"queries" must be a list of strings')
    if len(queries) > MAX_QUERIES_PER_REQUEST:
        raise ValueError(f"at most {MAX_QUERIES_PER_REQUEST} queries per request")
    topk = request.get("topk", default_topk)
    if not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f'"topk" must be an integer in [1, {MAX_TOPK}]')
    return queries, topk, bool(request.get("return_scores", True))


def _make_handler(index: BM25Index, default_topk: int) -> type[BaseHTTPRequestHandler]:
    class RetrievalHandler(BaseHTTPRequestHandler):
        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply(200, {"status": "ok", "num_documents": len(index.documents)})
            else:
                self._reply(404, {"error": f"unknown path {self.path}; use POST /retrieve or GET /health"})

        def do_POST(self) -> None:
            if self.path != "/retrieve":
                self._reply(404, {"error": f"unknown path {self.path}; use POST /retrieve"})
                return
            try:
                length = int(self.headers.get("Content-Length", 0))
                queries, topk, return_scores = parse_request(self.rfile.read(length), default_topk)
            except ValueError as error:  # json.JSONDecodeError is a ValueError
                self._reply(400, {"error": str(error)})
                return
            hits = index.search(queries, topk) if queries else []
            result = [
                [{"document": doc, "score": score} if return_scores else {"document": doc} for doc, score in row]
                for row in hits
            ]
            self._reply(200, {"result": result})

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("retrieval server: " + format, *args)

    return RetrievalHandler


class RetrievalServer:
    """The HTTP service around a BM25Index. `start()` serves in a background thread; `serve_forever()` blocks."""

    def __init__(self, index: BM25Index, host: str = "127.0.0.1", port: int = 8000, topk: int = 3) -> None:
        self.index = index
        self.httpd = ThreadingHTTPServer((host, port), _make_handler(index, topk))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RetrievalServer:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="retrieval-server", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hyflow serve-retrieval",
        description="Serve BM25 search over a JSONL corpus at POST /retrieve, for the `search` tool.",
    )
    parser.add_argument("--corpus", required=True, help="JSONL file, one document per line")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at start)")
    parser.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        documents = load_corpus(args.corpus)
    except (OSError, ValueError) as error:
        print(f"hyflow serve-retrieval: {error}", file=sys.stderr)
        return 2
    server = RetrievalServer(BM25Index(documents), args.host, args.port, args.topk)
    print(f"serving {len(documents)} documents at {server.url}/retrieve (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0
