"""Tests of agent_stdlib.proxy.main against small in-process backends (127.0.0.1 only)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from agent_stdlib.proxy.config import ProxyConfig
from agent_stdlib.proxy.http import parse_queue_metric
from agent_stdlib.proxy.main import Proxy
from agent_stdlib.proxy.route import Router
from fixtures.fake_openai_server import (
    DEFAULT_MODEL,
    RunningServer,
    expected_completion,
    serve_in_thread,
)

REPO = Path(__file__).resolve().parents[2]
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


@pytest.fixture
def backends() -> Iterator[Callable[..., Backend]]:
    made: List[Backend] = []

    def make(*args: object, **kwargs: object) -> Backend:
        be = Backend(*args, **kwargs)  # type: ignore[arg-type]
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


@pytest.fixture
def proxy() -> Iterator[Callable[..., Proxy]]:
    made: List[Proxy] = []

    def make(urls: List[str], **kwargs: object) -> Proxy:
        p = Proxy(ProxyConfig(backends=urls, **kwargs))  # type: ignore[arg-type]
        p.start()
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


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
# Core: routing, streaming, bodies


def test_least_outstanding_requests_prefers_fast_backend(backends, proxy) -> None:
    slow, fast = backends("hold"), backends("echo")
    p = proxy([slow.url, fast.url])
    done: List[int] = []
    threads = []
    for i in range(20):
        t = threading.Thread(target=lambda: done.append(request(p)[0]))
        t.start()
        threads.append(t)
        wait_for(lambda n=i + 1: slow.count + len(done) == n, what=f"request {i}")
        wait_for(lambda: in_flight(p)[1] == 0, what="fast backend idle")
    assert slow.count == 1
    assert fast.count == 19
    slow.release.set()
    for t in threads:
        t.join(WAIT)
    assert done == [200] * 20


def test_ties_are_broken_round_robin(backends, proxy) -> None:
    a, b, c = backends(), backends(), backends()
    p = proxy([a.url, b.url, c.url])
    for _ in range(9):
        assert request(p)[0] == 200
        wait_for(lambda: in_flight(p) == [0, 0, 0])
    assert (a.count, b.count, c.count) == (3, 3, 3)


@pytest.mark.parametrize("mode", ["stream", "stream_eof"])
def test_streaming_first_chunk_arrives_before_backend_finishes(backends, proxy, mode) -> None:
    be = backends(mode)
    p = proxy([be.url])
    s = raw(p)
    body = b'{"stream": true}'
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    first = read_until(s, b"data: one")
    assert b"data: two" not in first  # the backend is still blocked on the event
    head, _, rest = first.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding: chunked" in head.lower()
    be.release.set()
    rest = read_until(s, b"0\r\n\r\n", rest)
    text = dechunk(rest)
    assert text == b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"
    # the connection stays usable after a streamed response
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_until(s, b'"status"').startswith(b"HTTP/1.1 200")
    s.close()


def test_content_length_request_body(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url])
    payload = os.urandom(300_000)
    status, headers, body = request(p, body=payload)
    assert status == 200 and body == payload and headers["x-echo"] == "1"
    assert be.requests[-1] == ("/v1/completions", payload)


def test_chunked_request_body(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url])
    s = raw(p)
    s.sendall(
        b"POST /v1/completions?a=1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n"
    )
    s.sendall(b"1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n")
    resp = read_until(s, b"hello world")
    assert resp.startswith(b"HTTP/1.1 200")
    assert be.requests[-1] == ("/v1/completions?a=1", b"hello world")
    s.close()

    conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=WAIT)
    conn.request("POST", "/v1/x", body=iter([b"a" * 70000, b"b" * 5]), encode_chunked=True)
    assert conn.getresponse().read() == b"a" * 70000 + b"b" * 5
    conn.close()


def test_expect_100_continue(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url])
    s = raw(p)
    s.sendall(
        b"POST /v1/x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"
    )
    assert read_until(s, b"\r\n\r\n").startswith(b"HTTP/1.1 100 Continue")
    s.sendall(b"abc")
    assert read_until(s, b"abc").count(b"HTTP/1.1 200") == 1
    s.close()


def test_keep_alive_reuses_client_and_backend_connections(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url])
    conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=WAIT)
    conn.connect()
    sock = conn.sock
    for i in range(5):
        conn.request("POST", "/v1/x", body=b"n%d" % i)
        assert conn.getresponse().read() == b"n%d" % i
        assert conn.sock is sock
    assert "synthbatch_proxy_client_connections 1" in p.metrics_text()
    assert len(set(be.ports)) == 1
    conn.close()


def test_backend_closing_kept_alive_connections_is_transparent(backends, proxy) -> None:
    be = backends("echo_then_close")
    p = proxy([be.url])
    for i in range(20):
        assert request(p, body=b"r%d" % i)[::2] == (200, b"r%d" % i)
    assert be.count == 20
    assert "synthbatch_proxy_retries_total 0" in p.metrics_text()


def test_idle_backend_connections_are_reaped(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url], pool_idle_timeout=0.5)
    assert request(p)[0] == 200
    wait_for(lambda: len(p.backends[0].pool) == 1, what="connection pooled")
    wait_for(lambda: not p.backends[0].pool, what="pooled connection reaped")
    assert request(p)[0] == 200
    assert len(set(be.ports)) == 2


# --------------------------------------------------------------------------------------
# Failover


def test_failover_when_a_backend_refuses_connections(backends, proxy) -> None:
    be = backends()
    dead = dead_url()
    p = proxy([dead, be.url])
    for _ in range(10):
        assert request(p)[0] == 200
    assert be.count == 10
    health = p.health()
    assert health["status"] == "ok"
    assert health["backends"][0]["healthy"] is False  # type: ignore[index]
    assert "synthbatch_proxy_retries_total 0" not in p.metrics_text()


def test_429_passthrough_when_all_backends_answer_429(backends, proxy) -> None:
    a, b = backends("status", status=429), backends("status", status=429)
    p = proxy([a.url, b.url])
    status, headers, body = request(p)
    assert status == 429
    assert headers["retry-after"] == "7"
    assert json.loads(body)["error"]["message"] == "busy 429"
    assert (a.count, b.count) == (1, 1)
    assert 'responses_429_total{source="backend"} 1' in p.metrics_text()


def test_503_is_retried_on_another_backend(backends, proxy) -> None:
    a, b = backends("status", status=503), backends()
    p = proxy([a.url, b.url])
    for _ in range(4):
        assert request(p, body=b"ok")[:1] == (200,)
    assert b.count == 4
    assert a.count <= 4


def test_empty_bodies_end_the_exchange_on_a_kept_alive_connection(backends, proxy) -> None:
    busy, empty = backends("empty", status=503), backends("empty", status=200)
    p = proxy([busy.url, empty.url])
    conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=WAIT)
    try:
        for _ in range(4):  # each answer must end its exchange, or the next one never comes
            conn.request("POST", "/v1/completions", body=b"{}")
            resp = conn.getresponse()
            assert (resp.status, resp.getheader("content-length"), resp.read()) == (200, "0", b"")
    finally:
        conn.close()
    assert empty.count == 4  # the empty 503s failed over to it
    wait_for(lambda: in_flight(p) == [0, 0])


def test_502_when_all_backends_are_down(proxy, caplog) -> None:
    caplog.set_level(logging.INFO, logger="synthbatch.proxy")
    p = proxy([dead_url(), dead_url()])
    for _ in range(3):
        status, headers, body = request(p)
        assert status == 502
        assert json.loads(body)["error"]["type"] == "proxy_error"
    status, _, body = request(p, "GET", "/health")
    assert status == 503
    assert json.loads(body)["status"] == "unavailable"
    downs = [r for r in caplog.records if "marked down" in r.getMessage()]
    assert len(downs) == 2  # one line per backend, not one per request


def test_backend_marked_up_again_after_recovery(backends, proxy, caplog) -> None:
    caplog.set_level(logging.INFO, logger="synthbatch.proxy")
    be = backends()
    port = be.server.server_address[1]
    be.close()
    p = proxy([be.url], down_seconds=0.2)
    for _ in range(3):
        assert request(p)[0] == 502
    assert p.health()["status"] == "unavailable"
    revived = Backend(port=port)
    try:
        wait_for(lambda: request(p)[0] == 200, what="recovered backend")
        assert p.health()["status"] == "ok"
        assert any("marked up" in r.getMessage() for r in caplog.records)
    finally:
        revived.close()


# --------------------------------------------------------------------------------------
# Backpressure


def test_parse_queue_metric() -> None:
    text = (
        "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 2\n'
        'vllm:num_requests_running{model_name="m"} 9\n'
        "garbage line\n"
    )
    assert parse_queue_metric(text) == 5.0
    assert parse_queue_metric("llamacpp:requests_deferred 4 1700000000\n") == 4.0
    assert parse_queue_metric("other 1\n") is None
    assert parse_queue_metric("vllm:num_requests_waiting NaN\n") is None


def test_backpressure_429_when_every_backend_is_over_max_queued(backends, proxy) -> None:
    metrics = 'vllm:num_requests_waiting{model_name="a"} 3\nvllm:num_requests_waiting{x="b"} 2\n'
    be = backends(metrics=metrics)
    p = proxy([be.url], max_queued=4)
    wait_for(lambda: p.health()["backends"][0]["queued"] == 5, what="metrics sample")  # type: ignore[index]
    status, headers, body = request(p)
    assert status == 429
    assert headers["retry-after"] == "1"
    assert json.loads(body)["error"]["type"] == "proxy_error"
    assert be.count == 0
    be.metrics = "vllm:num_requests_waiting 0\n"
    wait_for(lambda: p.health()["backends"][0]["queued"] == 0, what="metrics sample")  # type: ignore[index]
    assert request(p)[0] == 200


def test_backpressure_routes_to_backend_under_the_limit(backends, proxy) -> None:
    full = backends(metrics="vllm:num_requests_waiting 10\n")
    free = backends(metrics="vllm:num_requests_waiting 0\n")
    p = proxy([full.url, free.url], max_queued=4)
    wait_for(lambda: [b["queued"] for b in p.health()["backends"]] == [10, 0])  # type: ignore[index]
    for _ in range(4):
        assert request(p)[0] == 200
        wait_for(lambda: in_flight(p) == [0, 0])
    assert (full.count, free.count) == (0, 4)


def test_backpressure_uses_own_in_flight_without_backend_metric(backends, proxy) -> None:
    be = backends("hold", metrics=None)  # /metrics answers 404
    p = proxy([be.url], max_queued=0)
    wait_for(lambda: p.health()["backends"][0]["queued"] == 0)  # type: ignore[index]
    result: List[int] = []
    t = threading.Thread(target=lambda: result.append(request(p)[0]))
    t.start()
    wait_for(lambda: be.count == 1)
    assert request(p)[0] == 429
    be.release.set()
    t.join(WAIT)
    assert result == [200]


def test_backpressure_fails_open_when_metrics_are_broken(backends, proxy) -> None:
    be = backends(metrics="vllm:num_requests_waiting 99\n")
    be.metrics_status = 500
    p = proxy([be.url], max_queued=1)
    wait_for(lambda: "synthbatch_proxy_backend_queued" in p.metrics_text())
    time.sleep(0.3)  # let a few samples happen; none may block traffic
    assert request(p)[0] == 200


def test_pick_sheds_a_first_attempt_only_when_every_healthy_backend_is_over_the_limit() -> None:
    router = Router(ProxyConfig(backends=["http://127.0.0.1:1", "http://127.0.0.1:2"],
                                max_queued=2))
    now = 100.0
    a, b = router.backends
    for backend, waiting in ((a, 5.0), (b, 1.0)):
        backend.sample_ok_at, backend.sampled_waiting = now, waiting
    assert router.pick(0, now) is b  # the one under the limit
    b.sampled_waiting = 3.0
    assert router.pick(0, now) is None  # both over: shed, nothing counted in flight
    assert (a.in_flight, b.in_flight) == (0, 1)
    assert router.pick(1 << b.index, now) is a  # a failover is never shed
    b.down_until = now + 5  # the only healthy backend is over the limit: still shed
    assert router.pick(0, now) is None
    a.down_until = now + 5  # all down: tried anyway, over the limit or not
    assert router.pick(0, now) in (a, b)
    a.down_until = b.down_until = 0.0
    a.sample_ok_at = now - 60  # a stale sample is unknown: fail open
    assert router.pick(0, now) is a


# --------------------------------------------------------------------------------------
# Limits


def test_431_on_huge_headers(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url], max_header_bytes=8192)
    status, _, body = request(p, headers={"X-Big": "x" * 20000})
    assert status == 431
    assert json.loads(body)["error"]["type"] == "proxy_error"
    assert be.count == 0


def test_413_on_huge_body(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url], max_body_bytes=1000)
    status, _, _ = request(p, body=b"x" * 5000)
    assert status == 413
    s = raw(p)
    s.sendall(b"POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    s.sendall(b"400\r\n" + b"y" * 1024 + b"\r\n")
    assert read_until(s, b"\r\n\r\n").startswith(b"HTTP/1.1 413")
    s.close()
    assert be.count == 0


def test_header_timeout_closes_slow_clients(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url], header_timeout=0.3)
    s = raw(p)
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
    data = s.recv(65536)
    assert data.startswith(b"HTTP/1.1 408")
    s.close()


def test_idle_keep_alive_timeout(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url], idle_timeout=0.3)
    s = raw(p)
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    read_until(s, b"{}")
    assert s.recv(100) == b""  # closed by the proxy after the idle timeout
    s.close()


def test_max_connections(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url], max_connections=2)
    held = [raw(p), raw(p)]
    s = raw(p)
    assert read_until(s, b"\r\n\r\n").startswith(b"HTTP/1.1 503")
    s.close()
    for h in held:
        h.close()
    wait_for(lambda: "synthbatch_proxy_client_connections 0" in p.metrics_text())
    assert request(p)[0] == 200


def test_accept_failure_pauses_accepting_then_serves_the_waiting_client(
        backends, proxy, caplog, monkeypatch) -> None:
    from agent_stdlib.proxy import core as proxy_core

    monkeypatch.setattr(proxy_core, "ACCEPT_PAUSE_S", 0.2)
    be = backends()
    p = proxy([be.url])

    class OutOfFds:
        """The listener, except that the first accept fails like EMFILE."""

        def __init__(self, real: socket.socket) -> None:
            self.real, self.failed = real, False

        def accept(self):  # type: ignore[no-untyped-def]
            if not self.failed:
                self.failed = True
                raise OSError(24, "Too many open files")
            return self.real.accept()

        def fileno(self) -> int:
            return self.real.fileno()

        def close(self) -> None:
            self.real.close()

    installed = threading.Event()

    def install() -> None:
        p.core.listener = OutOfFds(p.core.listener)  # type: ignore[assignment]
        installed.set()

    p.core.loop.call_threadsafe(install)
    assert installed.wait(WAIT)
    with caplog.at_level(logging.WARNING, logger="synthbatch.proxy"):
        assert request(p)[0] == 200  # waits in the backlog until accepting resumes
    assert "accept failed ([Errno 24] Too many open files); pausing accepts" in caplog.text


# --------------------------------------------------------------------------------------
# Connection hygiene


def test_client_disconnect_mid_stream_closes_backend_connection(backends, proxy) -> None:
    be = backends("stream_until_close")
    p = proxy([be.url])
    s = raw(p)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    read_until(s, b"data: one")
    s.close()
    assert be.saw_close.wait(WAIT)
    wait_for(lambda: in_flight(p) == [0], what="in-flight released")


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_10000_requests_do_not_leak_fds(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url], pool_idle_timeout=0.3)
    assert request(p)[0] == 200

    def idle() -> bool:
        text = p.metrics_text()
        return "synthbatch_proxy_client_connections 0" in text and not p.backends[0].pool

    wait_for(idle, what="idle proxy")
    before = _fd_count()
    for i in range(2000):  # a new client connection each
        assert request(p, body=b"%d" % i)[2] == b"%d" % i
    failures: List[str] = []

    def keep_alive_client(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=WAIT)
        try:
            for i in range(2000):
                conn.request("POST", "/v1/x", body=b"c%d-%d" % (n, i))
                if conn.getresponse().read() != b"c%d-%d" % (n, i):
                    failures.append(f"client {n} request {i}")
        except (OSError, http.client.HTTPException) as exc:
            failures.append(repr(exc))
        finally:
            conn.close()

    threads = [threading.Thread(target=keep_alive_client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    wait_for(idle, what="connections closed and pool reaped")
    wait_for(lambda: _fd_count() <= before + 2, what="fds back to the start")
    text = p.metrics_text()
    assert "synthbatch_proxy_requests_total 10001" in text
    assert f'synthbatch_proxy_in_flight{{backend="{be.url}"}} 0' in text


def test_own_metrics_endpoint(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url])
    assert request(p)[0] == 200
    wait_for(lambda: in_flight(p) == [0])
    status, headers, body = request(p, "GET", "/metrics")
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("requests_total", "retries_total", "bytes_in_total", "bytes_out_total"):
        assert f"synthbatch_proxy_{name}" in text
    assert f'synthbatch_proxy_in_flight{{backend="{be.url}"}} 0' in text
    assert be.count == 1  # /metrics was served by the proxy itself


def test_stop_closes_active_connections(backends) -> None:
    be = backends("hold")
    p = Proxy(ProxyConfig(backends=[be.url]))
    p.start()
    result: List[object] = []

    def call() -> None:
        try:
            result.append(request(p)[0])
        except (OSError, http.client.HTTPException) as exc:
            result.append(type(exc))

    t = threading.Thread(target=call)
    t.start()
    wait_for(lambda: be.count == 1)
    p.stop()
    t.join(WAIT)
    assert not t.is_alive() and result and result[0] != 200
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", p.port), timeout=1).close()


def test_config_rejects_non_loopback_listen() -> None:
    with pytest.raises(ValueError):
        Proxy(ProxyConfig(backends=["http://127.0.0.1:1"], host="0.0.0.0"))
    with pytest.raises(ValueError):
        Proxy(ProxyConfig(backends=[]))


# --------------------------------------------------------------------------------------
# CLI


def test_main_subprocess_port_file_and_sigterm(backends, tmp_path) -> None:
    be = backends()
    port_file = tmp_path / "proxy.port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent_stdlib",
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            be.url,
            "--port-file",
            str(port_file),
            "--max-queued",
            "100",
        ],
        cwd=str(REPO),
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        wait_for(port_file.exists, what="port file")
        port = int(port_file.read_text())
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
        conn.request("GET", "/health")
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["status"] == "ok"
        conn.request("POST", "/v1/completions", body=b"hi")
        assert conn.getresponse().read() == b"hi"
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "listening on 127.0.0.1:" in err
    assert list(tmp_path.iterdir()) == [port_file]  # no temp file left behind


def test_main_bad_arguments_return_nonzero() -> None:
    from agent_stdlib.proxy.main import main

    assert main([]) == 2
    assert main(["--backend", "ftp://x", "--listen", "127.0.0.1:0"]) == 1


# --------------------------------------------------------------------------------------
# Against fixtures/fake_openai_server.py (vLLM-like backends)


@pytest.fixture
def fake_servers() -> Iterator[Callable[..., RunningServer]]:
    made: List[RunningServer] = []

    def make(**options: object) -> RunningServer:
        server = serve_in_thread(**options)
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


def completion(p: Proxy, prompt: str, max_tokens: int = 3) -> Tuple[int, Dict[str, object]]:
    body = json.dumps({"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": max_tokens})
    status, _, data = request(p, body=body.encode(), headers={"Content-Type": "application/json"})
    return status, json.loads(data)


def test_skewed_latency_slow_backend_gets_fewer_requests(fake_servers, proxy) -> None:
    slow = fake_servers(token_latency=0.05)  # 5 tokens: ~0.25 s per request
    fast = fake_servers()
    p = proxy([slow.url, fast.url])
    statuses: List[int] = []

    def worker(n: int) -> None:
        for i in range(15):
            statuses.append(completion(p, f"w{n}-{i}", max_tokens=5)[0])

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert statuses == [200] * 60
    served = [b["requests"] for b in p.health()["backends"]]  # type: ignore[index]
    assert sum(served) == 60
    assert served[0] * 3 < served[1], served


def test_streaming_from_fake_server_is_ordered_and_not_buffered(fake_servers, proxy) -> None:
    be = fake_servers(token_latency=0.05)
    p = proxy([be.url])
    body = json.dumps({"model": DEFAULT_MODEL, "prompt": "tell", "max_tokens": 6, "stream": True})
    s = raw(p)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode())
    )
    data, arrivals = b"", []
    while b"0\r\n\r\n" not in data:
        piece = s.recv(65536)
        assert piece, "EOF before the end of the stream"
        data += piece
        arrivals.append((time.monotonic(), data.count(b"data: ")))
    s.close()
    events = [e for e in dechunk(data.partition(b"\r\n\r\n")[2]).split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert text == expected_completion(DEFAULT_MODEL, "tell", 6)
    # 6 tokens 50 ms apart: a buffering proxy would deliver them all at once
    first_event = next(t for t, n in arrivals if n >= 1)
    assert arrivals[-1][0] - first_event >= 0.15


def _spawn_fake_server(tmp_path: Path, name: str) -> Tuple[subprocess.Popen, str]:
    port_file = tmp_path / f"{name}.port"
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "fixtures" / "fake_openai_server.py"), "--port-file",
         str(port_file)],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for(port_file.exists, what=f"{name} port file")
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"


def test_failover_when_a_backend_is_killed(proxy, tmp_path) -> None:
    victim, victim_url = _spawn_fake_server(tmp_path, "victim")
    survivor, survivor_url = _spawn_fake_server(tmp_path, "survivor")
    try:
        p = proxy([victim_url, survivor_url])
        for i in range(6):  # both backends used; the victim's connection is now pooled
            assert completion(p, f"before {i}")[0] == 200
        assert min(b["requests"] for b in p.health()["backends"]) > 0  # type: ignore[index]
        victim.kill()
        victim.wait(WAIT)
        for i in range(10):
            status, doc = completion(p, f"after {i}")
            assert status == 200, doc
            assert doc["choices"][0]["text"] == expected_completion(DEFAULT_MODEL, f"after {i}", 3)
        assert p.health()["backends"][0]["healthy"] is False  # type: ignore[index]
    finally:
        for proc in (victim, survivor):
            proc.kill()
            proc.wait(WAIT)


def test_backpressure_from_fake_server_queue(fake_servers, proxy) -> None:
    be = fake_servers(token_latency=0.1, max_concurrency=1)
    p = proxy([be.url], max_queued=1, metrics_interval=0.05)
    results: List[int] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(completion(p, f"q{i}", 12)[0]))
        for i in range(3)
    ]
    for t in threads:
        t.start()
    # one request runs (1.2 s), two wait: vllm:num_requests_waiting 2 > max_queued 1
    wait_for(lambda: p.health()["backends"][0]["queued"] == 2, what="queue sample")  # type: ignore[index]
    status, doc = completion(p, "rejected")
    assert status == 429 and doc["error"]["type"] == "proxy_error"
    assert 'responses_429_total{source="proxy"} 1' in p.metrics_text()
    for t in threads:
        t.join(30)
    assert results == [200, 200, 200]


# --------------------------------------------------------------------------------------
# More protocol details


def test_slowloris_drip_is_cut_at_the_header_deadline(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url], header_timeout=0.5)
    s = raw(p)
    start = time.monotonic()
    s.sendall(b"GET /v1/models HTTP/1.1\r\n")
    answer = b""
    for _ in range(int(WAIT / 0.05)):  # one byte every 50 ms never completes the head
        try:
            s.sendall(b"X")
        except OSError:
            break
        readable, _, _ = select.select([s], [], [], 0.05)
        if readable:
            answer = s.recv(65536)
            break
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - start < WAIT
    s.close()
    assert be.count == 0


def test_pipelined_requests_are_answered_in_order(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url])
    s = raw(p)
    s.sendall(
        b"POST /v1/a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none"
        b"POST /v1/b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\ntwo"
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    data = read_until(s, b'"status"')
    assert data.count(b"HTTP/1.1 200") == 3
    assert data.index(b"one") < data.index(b"two") < data.index(b'"status"')
    s.close()
    assert [path for path, _ in be.requests] == ["/v1/a", "/v1/b"]


def test_http10_client_gets_close_delimited_stream(backends, proxy) -> None:
    be = backends("stream")
    be.release.set()
    p = proxy([be.url])
    s = raw(p)
    s.sendall(b"POST /v1/x HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}")
    data = b""
    while True:
        piece = s.recv(65536)
        if not piece:
            break
        data += piece
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower() and b"transfer-encoding" not in head.lower()
    assert body == b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"


def test_tcp_nodelay_on_client_and_backend_sockets(backends, proxy) -> None:
    be = backends()
    p = proxy([be.url])
    conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=WAIT)
    conn.request("POST", "/v1/x", body=b"x")
    assert conn.getresponse().read() == b"x"
    wait_for(lambda: len(p.backends[0].pool) == 1)
    socks = [c.transport.sock for c in list(p.core.clients)]
    socks += [u.transport.sock for u in list(p.core.upstreams)]
    assert len(socks) == 2
    for sock in socks:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    conn.close()


def test_sampler_survives_errors_and_recovers(backends, proxy) -> None:
    be = backends(metrics="not a metric at all {{{\n")
    be.metrics_status = 500
    p = proxy([be.url], max_queued=5, metrics_interval=0.05)
    wait_for(lambda: "synthbatch_proxy_backend_queued{" in p.metrics_text())
    be.metrics_status = 200
    be.metrics = "vllm:num_requests_waiting 9\n"
    wait_for(lambda: p.health()["backends"][0]["queued"] == 9, what="sample after errors")  # type: ignore[index]
    assert request(p)[0] == 429
