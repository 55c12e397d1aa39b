"""Fuzzing the proxy with malformed HTTP (docs/reliability.md).

A valid request gets one to three malformations (its request line, a header name or
value, bare LF, obs-fold, Content-Length and Transfer-Encoding values, chunk sizes, an
oversize head), is sent in random pieces, sometimes cut short and closed early. The proxy
answers a 4xx (or 501/505) and closes, or just closes; a valid request gets the backend's
200. After every case a normal request still succeeds, the connection is gone from the
proxy's tables within its timeouts, and at the end the proxy holds no more connections,
event-loop handlers, timers or file descriptors than before the first case. Slowloris
(heads and bodies sent a byte at a time) and early closes have targets of their own.
"""

from __future__ import annotations

import gc
import os
import socket
import threading
import time
import tracemalloc
from typing import Callable, Iterator, List, Optional, Tuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synthbatch.agent_stdlib.proxy.config import ProxyConfig
from synthbatch.agent_stdlib.proxy.main import Proxy
from tests.fakes import budget, fuzz
from tests.unit.agent.proxy.harness import Backend, request, wait_for

REJECTED = frozenset(range(400, 500)) | {501, 505}
BODY = b'{"prompt": "x"}'
MAX_HEAD = 4096


def _head(method: bytes = b"POST", target: bytes = b"/v1/completions",
          version: bytes = b"HTTP/1.1", headers: Optional[List[bytes]] = None) -> List[bytes]:
    lines = [b" ".join((method, target, version)), b"Host: 127.0.0.1",
             b"Content-Type: application/json", b"Connection: close"]
    return lines + (headers or [])


def _valid() -> Tuple[List[bytes], bytes]:
    return _head(headers=[b"Content-Length: %d" % len(BODY)]), BODY


# Each malformation turns (head lines, body) into a request the proxy must refuse.
Mutation = Callable[[List[bytes], bytes, st.DataObject], Tuple[List[bytes], bytes]]
HEADER_NAMES = [b"X Bad", b"X\x00", b"X(y)", b"", b"X@y", b"\xff", b" X", b"X\t"]
HEADER_VALUES = [b"a\x00b", b"a\rb", b"a\nb"]
LENGTHS = [b"-1", b"1e3", b"0x10", b"", b" ", b"99999999999999999999", b"5, 6", b"+5",
           b"\xd9\xa1"]
ENCODINGS = [b"gzip", b"chunked, gzip", b"xchunked", b"chunked\x00", b"identity"]
CHUNKS = [b"zz\r\nab\r\n0\r\n\r\n", b"-1\r\nab\r\n0\r\n\r\n",
          b"fffffffffffffffffff\r\nab\r\n0\r\n\r\n", b"2\r\nabXX0\r\n\r\n",
          b"2;\x00\r\nab\r\n0\r\n\r\n", b"\r\n\r\n"]


def _request_line(lines: List[bytes], body: bytes, data: st.DataObject):  # type: ignore
    line = data.draw(st.sampled_from([
        b"POST /v1/completions", b"POST  /v1/completions HTTP/1.1",
        b"POST /v1/completions HTTP/2.0", b"POST /v1/completions http/1.1",
        b"POST /v1/completions HTTP/1.1x", b"POST http://evil/x HTTP/1.1",
        b"POST * HTTP/1.1", b"POST /a /b HTTP/1.1", b" /v1/completions HTTP/1.1",
        b"POST /v1/completions HTTP/1.1 extra"]), label="request line")
    return [line] + lines[1:], body


def _bad_name(lines, body, data):  # type: ignore[no-untyped-def]
    name = data.draw(st.sampled_from(HEADER_NAMES), label="header name")
    return lines + [name + b": 1"], body


def _no_colon(lines, body, data):  # type: ignore[no-untyped-def]
    return lines + [b"X-No-Colon"], body


def _bad_value(lines, body, data):  # type: ignore[no-untyped-def]
    return lines + [b"X-V: " + data.draw(st.sampled_from(HEADER_VALUES), label="value")], body


def _obs_fold(lines, body, data):  # type: ignore[no-untyped-def]
    return lines + [b"X-Folded: a", b" b"], body


def _bare_lf(lines, body, data):  # type: ignore[no-untyped-def]
    return [lines[0] + b"\nX-Lf: 1"] + lines[1:], body


def _length(lines, body, data):  # type: ignore[no-untyped-def]
    value = data.draw(st.sampled_from(LENGTHS), label="content-length")
    kept = [line for line in lines if not line.startswith(b"Content-Length")]
    return kept + [b"Content-Length: " + value], body


def _two_lengths(lines, body, data):  # type: ignore[no-untyped-def]
    return lines + [b"Content-Length: %d" % (len(body) + 1)], body


def _length_and_chunked(lines, body, data):  # type: ignore[no-untyped-def]
    kept = [line for line in lines if not line.startswith(b"Content-Length")]
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return kept + [b"Content-Length: %d" % len(chunked), b"Transfer-Encoding: chunked"], chunked


def _encoding(lines, body, data):  # type: ignore[no-untyped-def]
    value = data.draw(st.sampled_from(ENCODINGS), label="transfer-encoding")
    kept = [line for line in lines if not line.startswith(b"Content-Length")]
    return kept + [b"Transfer-Encoding: " + value], body


def _chunks(lines, body, data):  # type: ignore[no-untyped-def]
    kept = [line for line in lines if not line.startswith(b"Content-Length")]
    return kept + [b"Transfer-Encoding: chunked"], data.draw(st.sampled_from(CHUNKS),
                                                                label="chunks")


def _oversize(lines, body, data):  # type: ignore[no-untyped-def]
    return lines + [b"X-Big: " + b"a" * MAX_HEAD], body


MUTATIONS: List[Mutation] = [_request_line, _bad_name, _no_colon, _bad_value, _obs_fold,
                             _bare_lf, _length, _two_lengths, _length_and_chunked, _encoding,
                             _chunks, _oversize]


@pytest.fixture
def served() -> Iterator[Tuple[Proxy, Backend]]:
    backend = Backend("echo")
    proxy = Proxy(ProxyConfig(backends=[backend.url], header_timeout=0.5, idle_timeout=1.0,
                              max_header_bytes=MAX_HEAD, pool_idle_timeout=0.5))
    proxy.start()
    yield proxy, backend
    proxy.stop()
    backend.close()


def _exchange(proxy: Proxy, pieces: List[bytes], close_early: bool) -> bytes:
    """Send ``pieces``; read until the proxy closes (or 3 s); return what it answered.

    The write side stays open: like nginx, the proxy takes a client's EOF for an abort."""
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=3.0)
    got = b""
    try:
        for piece in pieces:
            sock.sendall(piece)
        if close_early:
            return b""
        while True:
            data = sock.recv(65536)
            if not data:
                break
            got += data
    except (ConnectionResetError, BrokenPipeError, socket.timeout):
        pass
    finally:
        sock.close()
    return got


def _status(answer: bytes) -> Optional[int]:
    line = answer.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    assert len(parts) >= 2 and parts[0] == b"HTTP/1.1" and parts[1].isdigit(), answer[:200]
    return int(parts[1])


def _tables(proxy: Proxy) -> Tuple[int, int, int]:
    core = proxy.core
    return len(core.clients), len(core.connecting), len(core.addrs)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _settled(proxy: Proxy, fds: int, handlers: int, timers: int) -> None:
    """No client connection left, and handlers, timers, fds back to their first count
    (the idle pool to the backend is reaped after ``pool_idle_timeout``)."""
    core = proxy.core
    wait_for(lambda: _tables(proxy)[:2] == (0, 0) and len(core.loop.handlers) <= handlers
             and len(core.loop._timers) <= timers and _fds() <= fds,
             timeout=10, what=f"proxy settled: {_tables(proxy)}, {len(core.loop.handlers)} "
                              f"handlers, {len(core.loop._timers)} timers, {_fds()} fds")


def _warm(proxy: Proxy) -> Tuple[int, int, int]:
    """One request served and settled: the fds, handlers and timers to come back to."""
    assert request(proxy)[0] == 200
    _settled(proxy, 10 ** 6, 10 ** 6, 10 ** 6)
    return _fds(), len(proxy.core.loop.handlers), len(proxy.core.loop._timers)


@fuzz(ci=250, long=10_000)
@given(data=st.data())
def test_malformed_requests_get_a_4xx_or_a_close_and_the_proxy_keeps_serving(
        served: Tuple[Proxy, Backend], data: st.DataObject) -> None:
    proxy, _ = served
    lines, body = _valid()
    malformed = data.draw(st.booleans(), label="malformed")
    if malformed:
        for mutate in data.draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3),
                                label="mutations"):
            lines, body = mutate(lines, body, data)
    wire = b"\r\n".join(lines) + b"\r\n\r\n" + body
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=4), label="cuts"))
    pieces = [wire[a:b] for a, b in zip([0] + cuts, cuts + [len(wire)])]
    close_early = data.draw(st.integers(0, 9), label="close early") == 0
    if close_early:
        pieces = pieces[:data.draw(st.integers(0, len(pieces)), label="pieces sent")]
    answer = _exchange(proxy, pieces, close_early)
    if answer:
        status = _status(answer)
        if malformed:
            assert status in REJECTED, (wire, answer[:300])
        else:
            assert status == 200, (wire, answer[:300])
    elif not close_early:
        assert malformed, f"a valid request got no answer: {wire!r}"
    assert request(proxy)[0] == 200
    wait_for(lambda: _tables(proxy)[:2] == (0, 0), timeout=5, what="connection dropped")


def test_many_malformed_requests_leave_no_connection_fd_timer_or_memory_behind(
        served: Tuple[Proxy, Backend]) -> None:
    proxy, _ = served
    core = proxy.core
    bad = [b"GET\r\n\r\n", b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
           b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
           b"POST / HTTP/1.1\r\nX: " + b"a" * MAX_HEAD + b"\r\n\r\n",
           b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\nab"]

    def round_(number: int) -> None:
        for wire in bad:  # the cut body waits out the idle timeout in every 4th round
            _exchange(proxy, [wire], close_early=number % 4 != 0 and wire.endswith(b"ab"))
        assert request(proxy)[0] == 200

    round_(0)
    _settled(proxy, 10 ** 6, 10 ** 6, 10 ** 6)
    tracemalloc.start()
    try:
        round_(0)
        _settled(proxy, 10 ** 6, 10 ** 6, 10 ** 6)
        gc.collect()
        baseline = (_fds(), len(core.loop.handlers), len(core.loop._timers))
        memory = tracemalloc.get_traced_memory()[0]
        for number in range(1, budget(16, 1_000)):
            round_(number)
        _settled(proxy, *baseline)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - memory
    finally:
        tracemalloc.stop()
    assert grown < 256 * 1024, f"{grown} bytes more after the rounds"


def test_slowloris_heads_and_bodies_are_cut_off_and_others_are_served(
        served: Tuple[Proxy, Backend]) -> None:
    proxy, _ = served
    baseline = _warm(proxy)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n"
    slow: List[socket.socket] = []
    stop = threading.Event()

    def trickle(sock: socket.socket, payload: bytes) -> None:
        for byte in payload:
            if stop.is_set():
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                return
            time.sleep(0.05)

    threads = []
    for index in range(20):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        slow.append(sock)
        payload = head + (b"\r\n" + b"x" * 10 if index % 2 else b"X-Slow: 1\r\n" * 10)
        thread = threading.Thread(target=trickle, args=(sock, payload), daemon=True)
        thread.start()
        threads.append(thread)
    try:
        for _ in range(5):  # the proxy serves others while the slow ones trickle
            assert request(proxy)[0] == 200
        started = time.monotonic()
        for sock in slow:  # each one is answered 408 or closed by the header/idle timeout
            sock.settimeout(5)
            try:
                answer = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                answer = b""
            if answer:
                assert _status(answer) in REJECTED, answer[:200]
        assert time.monotonic() - started < 5
    finally:
        stop.set()
        for sock in slow:
            sock.close()
        for thread in threads:
            thread.join(5)
    assert request(proxy)[0] == 200
    _settled(proxy, *baseline)


def test_clients_that_close_mid_response_leave_nothing_behind(
        served: Tuple[Proxy, Backend]) -> None:
    proxy, backend = served
    baseline = _warm(proxy)
    backend.mode = "hold"  # the backend answers only once released
    for _ in range(10):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        wait_for(lambda: backend.count > 0, what="request at the backend")
        sock.close()
    backend.release.set()
    backend.mode = "echo"
    assert request(proxy)[0] == 200
    _settled(proxy, *baseline)
