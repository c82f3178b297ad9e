"""Connections that send no request are closed: one silent from the start or trickling its headers (past
`--timeout-header`), one idle after its answer (past `--timeout-keep-alive`). Raw sockets against the server
`hyflow serve` runs (uvicorn with `uvicorn_options`), around an app that needs no model."""

from __future__ import annotations

import socket
import time

import pytest
from fastapi import FastAPI

from hyflow.serving.server import BackgroundServer

REQUEST = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"


@pytest.fixture(scope="module")
def quick_server():
    app = FastAPI()
    app.get("/health")(lambda: {"status": "ok"})
    with BackgroundServer(app, timeout_keep_alive=1, timeout_header=0.5) as running:
        yield running


def connect(server) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=20)  # far past both timeouts


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection (an orderly close or a reset) before the socket's timeout."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_connection_that_sends_nothing_is_closed(quick_server):
    with connect(quick_server) as sock:
        assert closed_by_server(sock)


def test_a_connection_trickling_its_headers_is_closed_before_they_are_complete(quick_server):
    with connect(quick_server) as sock:
        try:
            for byte in REQUEST[:-2]:  # never the final blank line: the headers stay incomplete
                sock.sendall(bytes([byte]))
                time.sleep(0.1)  # each byte well inside uvicorn's keep-alive timeout, the whole past the deadline
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while sending
        assert closed_by_server(sock)


def test_a_request_is_answered_and_the_idle_connection_then_closed(quick_server):
    with connect(quick_server) as sock:
        sock.sendall(REQUEST)
        answer = b""
        while b'{"status":"ok"}' not in answer:
            chunk = sock.recv(4096)
            assert chunk, f"closed before the answer: {answer!r}"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        assert closed_by_server(sock)
