"""The proxy core against small in-process backends: routing, streaming, bodies, failover."""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
from typing import List

import pytest

from tests.unit.agent.proxy.harness import (
    WAIT,
    Backend,
    dead_url,
    dechunk,
    in_flight,
    raw,
    read_until,
    request,
    wait_for,
)

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


