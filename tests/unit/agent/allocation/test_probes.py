"""Readiness probes: what ``http_ok`` asks a backend for, and what it calls ready."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator, List, Tuple

import pytest

from synthbatch.agent_stdlib.allocation.probes import http_ok


@pytest.fixture
def backend() -> Iterator[Tuple[str, List[str]]]:
    """A loopback server that records each request's target and answers 200 on /health."""
    seen: List[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(self.path)
            self.send_response(200 if self.path.startswith("/health") else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_probe_sends_the_path_and_the_query(backend: Tuple[str, List[str]]) -> None:
    url, seen = backend
    assert http_ok(url + "/health?ready=1&x=%2F")
    assert http_ok(url + "/health")
    assert seen == ["/health?ready=1&x=%2F", "/health"]  # the query was dropped before


def test_probe_is_false_for_other_statuses_and_no_server(backend: Tuple[str, List[str]]) -> None:
    url, _ = backend
    assert not http_ok(url + "/nope")
    assert not http_ok("http://127.0.0.1:1/health", 0.5)
