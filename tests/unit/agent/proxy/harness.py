"""Harness of the proxy tests: small in-process backends and client helpers (127.0.0.1).

Shared by the tests of ``tests/unit/agent/proxy``; the fixtures that build on them are in
that folder's ``conftest.py``.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Optional, Tuple

from fixtures.fake_openai_server import (
    DEFAULT_MODEL,
)
from synthbatch.agent_stdlib.proxy.main import Proxy

WAIT = 10.0


def wait_for(cond: Callable[[], bool], timeout: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# --------------------------------------------------------------------------------------
# Fake backend


class Backend:
    """A tiny OpenAI-ish backend whose behaviour is selected by ``mode``."""

    def __init__(
        self, mode: str = "echo", status: int = 200, metrics: Optional[str] = None, port: int = 0
    ) -> None:
        self.mode = mode
        self.status = status
        self.metrics = metrics
        self.metrics_status = 200
        self.release = threading.Event()
        self.saw_close = threading.Event()
        self.lock = threading.Lock()
        self.requests: List[Tuple[str, bytes]] = []
        self.ports: List[int] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self.server.backend = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def record(self, path: str, body: bytes, port: int) -> None:
        with self.lock:
            self.requests.append((path, body))
            self.ports.append(port)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    @property
    def be(self) -> Backend:
        return self.server.backend  # type: ignore[attr-defined]

    def _read_body(self) -> Optional[bytes]:
        try:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b""):
                            pass
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length", "0")))
        except (OSError, ValueError):
            return None

    def _send(self, status: int, body: bytes, headers: Optional[Dict[str, str]] = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _handle(self) -> None:
        be = self.be
        if self.path == "/metrics":
            if be.metrics is None:
                self._send(404, b"no metrics")
            else:
                self._send(be.metrics_status, be.metrics.encode())
            return
        body = self._read_body()
        if body is None:
            self.close_connection = True
            return
        be.record(self.path, body, self.client_address[1])
        getattr(self, "_mode_" + be.mode)(body)

    def _mode_echo(self, body: bytes) -> None:
        self._send(200, body or b"{}", {"Content-Type": "application/json", "X-Echo": "1"})

    def _mode_echo_then_close(self, body: bytes) -> None:
        self._send(200, body)
        self.close_connection = True  # closes without announcing it (stale keep-alive)

    def _mode_status(self, body: bytes) -> None:
        payload = json.dumps({"error": {"message": f"busy {self.be.status}"}}).encode()
        self._send(self.be.status, payload, {"Retry-After": "7"})

    def _mode_empty(self, body: bytes) -> None:
        self._send(self.be.status, b"")  # Content-Length: 0

    def _mode_hold(self, body: bytes) -> None:
        self.be.release.wait(WAIT)
        self._send(200, b'{"slow": true}')

    def _sse_headers(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _mode_stream(self, body: bytes) -> None:
        self._sse_headers()
        self._chunk(b"data: one\n\n")
        self.be.release.wait(WAIT)
        self._chunk(b"data: two\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _mode_stream_eof(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"data: one\n\n")
        self.wfile.flush()
        self.be.release.wait(WAIT)
        self.wfile.write(b"data: two\n\ndata: [DONE]\n\n")
        self.close_connection = True

    def _mode_stream_until_close(self, body: bytes) -> None:
        self._sse_headers()
        self._chunk(b"data: one\n\n")
        self.connection.settimeout(WAIT)
        try:
            if self.connection.recv(1) == b"":
                self.be.saw_close.set()
        except OSError:
            self.be.saw_close.set()
        self.close_connection = True


# --------------------------------------------------------------------------------------
# Fixtures and client helpers








def dead_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def request(
    p: Proxy,
    method: str = "POST",
    path: str = "/v1/completions",
    body: bytes = b'{"x": 1}',
    headers: Optional[Dict[str, str]] = None,
) -> Tuple[int, Dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=WAIT)
    try:
        conn.request(method, path, body=body if method == "POST" else None, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def raw(p: Proxy) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", p.port), timeout=WAIT)
    return s


def read_until(s: socket.socket, marker: bytes, buf: bytes = b"") -> bytes:
    while marker not in buf:
        data = s.recv(65536)
        if not data:
            raise AssertionError(f"EOF before {marker!r}; got {buf!r}")
        buf += data
    return buf


def in_flight(p: Proxy) -> List[int]:
    return [int(b["in_flight"]) for b in p.health()["backends"]]  # type: ignore[index]


def dechunk(data: bytes) -> bytes:
    out = b""
    while True:
        line, _, data = data.partition(b"\r\n")
        size = int(line, 16)
        if size == 0:
            return out
        out, data = out + data[:size], data[size + 2 :]


# --------------------------------------------------------------------------------------
# Against fixtures/fake_openai_server.py (vLLM-like backends)





def completion(p: Proxy, prompt: str, max_tokens: int = 3) -> Tuple[int, Dict[str, object]]:
    body = json.dumps({"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": max_tokens})
    status, _, data = request(p, body=body.encode(), headers={"Content-Type": "application/json"})
    return status, json.loads(data)


