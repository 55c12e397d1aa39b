"""The client side: limits, timeouts, connection hygiene and protocol details."""

from __future__ import annotations

import http.client
import json
import logging
import os
import select
import socket
import threading
import time
from typing import List

import pytest

from synthbatch.agent_stdlib.proxy.config import ProxyConfig
from synthbatch.agent_stdlib.proxy.main import Proxy
from tests.unit.agent.proxy.harness import (
    WAIT,
    in_flight,
    raw,
    read_until,
    request,
    wait_for,
)

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
    from synthbatch.agent_stdlib.proxy import core as proxy_core

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
