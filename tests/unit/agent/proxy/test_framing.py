"""Response framing through the proxy's protocol objects, with random splits.

A backend answer is cut into random pieces and fed to the upstream protocol; what the
client side writes must parse as one HTTP response with the right status and body, and
the exchange must end (the client connection ready for its next request, the backend's
in-flight slot given back) exactly when the answer is complete.
"""

from __future__ import annotations

import io
import random
from http.client import HTTPResponse
from typing import Any, List, Tuple

from synthbatch.agent_stdlib.proxy.client import HEAD, LINGER, Client
from synthbatch.agent_stdlib.proxy.config import ProxyConfig
from synthbatch.agent_stdlib.proxy.core import Core
from synthbatch.agent_stdlib.proxy.upstream import Upstream


class FakeStream:
    """Records what a protocol writes; stands in for proxy_loop.Stream."""

    def __init__(self) -> None:
        self.out: List[bytes] = []
        self.closed = self.eof = False

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def write_eof(self) -> None:
        self.eof = True

    def close(self) -> None:
        self.closed = True

    abort = close

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class FakeSocket:
    """Just enough of a socket for http.client.HTTPResponse."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.data)


def proxy_parts() -> Tuple[Core, Client, FakeStream, Upstream]:
    """A core with one pooled backend connection and one client (close ``core.loop``)."""
    core = Core(ProxyConfig(backends=["http://127.0.0.1:9"]))
    up = Upstream(core, core.router.backends[0])
    up.connection_made(FakeStream())  # type: ignore[arg-type]
    core.router.backends[0].pool.append(up)
    client = Client(core)
    client_stream = FakeStream()
    client.connection_made(client_stream)  # type: ignore[arg-type]
    return core, client, client_stream, up


def chunked(body: bytes, rng: random.Random) -> bytes:
    """Chunked encoding of ``body`` in random pieces, sometimes with an extension/trailer."""
    out, pos = b"", 0
    while pos < len(body):
        size = rng.randint(1, len(body) - pos)
        ext = b";x=1" if rng.random() < 0.2 else b""
        out += b"%x%s\r\n%s\r\n" % (size, ext, body[pos : pos + size])
        pos += size
    return out + b"0\r\n" + (b"X-Trailer: 1\r\n" if rng.random() < 0.2 else b"") + b"\r\n"


def answer(rng: random.Random, method: str) -> Tuple[bytes, int, bytes, bool]:
    """A random backend answer: (wire bytes, status, body the client must get, ends at EOF)."""
    status = rng.choice([200, 200, 201, 204, 304, 404, 429, 500, 503])  # 429/503: passed on
    body = bytes(rng.randrange(256) for _ in range(rng.choice([0, 0, 1, 7, 40])))
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" if rng.random() < 0.1 else b""
    head = b"HTTP/1.1 %d X\r\nServer: t\r\n" % status
    no_body = method == "HEAD" or status in (204, 304)
    framing = rng.choice(["length", "chunked", "eof"])
    if no_body:
        framing = rng.choice(["length", "none"])
        wire = head + (b"Content-Length: %d\r\n" % len(body) if framing == "length" else b"")
        return interim + wire + b"\r\n", status, b"", False
    if framing == "length":
        wire = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        return interim + wire, status, body, False
    if framing == "chunked":
        wire = head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body, rng)
        return interim + wire, status, body, False
    return interim + head + b"Connection: close\r\n\r\n" + body, status, body, True


def pieces(data: bytes, rng: random.Random) -> List[bytes]:
    """``data`` cut at random points (every piece non-empty)."""
    cuts = sorted(rng.sample(range(1, len(data)), min(rng.randint(0, 4), len(data) - 1)))
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


def parse(data: bytes, method: str) -> Any:
    resp = HTTPResponse(FakeSocket(data), method=method)  # type: ignore[arg-type]
    resp.begin()
    return resp


def test_random_answers_split_at_random_points_end_their_exchange() -> None:
    rng = random.Random(11)
    for case in range(3000):
        method = rng.choice(["POST", "POST", "GET", "HEAD"])
        http10 = rng.random() < 0.15
        wire, status, body, at_eof = answer(rng, method)
        core, client, client_stream, up = proxy_parts()
        request = b"%s /v1/x HTTP/1.%d\r\nHost: p\r\n" % (method.encode(), 0 if http10 else 1)
        request += b"Content-Length: 2\r\n\r\n{}" if method == "POST" else b"\r\n"
        client.data_received(request)
        assert up.ex is not None, case
        upstream_sent = b"".join(up.transport.out)  # type: ignore[union-attr]
        assert upstream_sent.startswith(b"%s /v1/x HTTP/1.1\r\n" % method.encode()), case
        for piece in pieces(wire, rng):
            assert client.ex is not None, (case, wire)  # not ended before the last byte
            up.data_received(piece)
        if at_eof:
            assert client.ex is not None, (case, wire)
            up.connection_lost(None)
        assert client.ex is None, (case, wire)  # ended with the answer's last byte
        assert core.router.backends[0].in_flight == 0, case
        sent = b"".join(client_stream.out)
        resp = parse(sent, method)
        got = resp.read()
        assert (resp.status, got) == (status, body), (case, wire, sent)
        # An HTTP/1.1 client keeps its connection (a close-delimited answer is re-framed as
        # chunks); the backend connection is reused unless the answer ended at its EOF.
        assert client.state == (LINGER if http10 else HEAD), (case, wire, sent)
        assert resp.will_close == http10, (case, sent)
        assert (up in core.router.backends[0].pool) == (not at_eof), case
        core.loop.close()


def dechunk(data: bytes) -> bytes:
    """Decode a complete chunked body (no trailers expected from the proxy's own framing)."""
    out, pos = b"", 0
    while True:
        eol = data.index(b"\r\n", pos)
        size = int(data[pos:eol].split(b";")[0], 16)
        if not size:
            return out
        out += data[eol + 2 : eol + 2 + size]
        pos = eol + 4 + size


def forwarded(up: Upstream) -> Tuple[bytes, bytes]:
    """(head, decoded body) of what the proxy sent the backend, taken off its stream."""
    stream = up.transport
    data = b"".join(stream.out)  # type: ignore[union-attr]
    stream.out.clear()  # type: ignore[union-attr]
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, dechunk(rest) if b"Transfer-Encoding: chunked" in head else rest


def test_random_request_bodies_split_at_random_points_reach_the_backend_intact() -> None:
    rng = random.Random(12)
    for case in range(2000):
        core, client, client_stream, up = proxy_parts()
        bodies = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 9, 60])))
                  for _ in range(rng.choice([1, 2]))]  # two: the second one pipelined
        wire = b""
        for body in bodies:
            wire += b"POST /v1/x HTTP/1.1\r\nHost: p\r\n"
            if rng.random() < 0.5:
                wire += b"Content-Length: %d\r\n\r\n" % len(body) + body
            else:
                wire += b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body, rng)
        for piece in pieces(wire, rng):
            client.data_received(piece)
        for i, body in enumerate(bodies):
            assert up.ex is not None and client.ex is up.ex, (case, i, wire)
            head, got = forwarded(up)
            assert head.startswith(b"POST /v1/x HTTP/1.1\r\nHost: 127.0.0.1:9"), (case, head)
            assert b"\r\nHost: p" not in head and got == body, (case, i, wire, head, got)
            up.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        assert client.ex is None and client.state == HEAD and not client.buf, (case, wire)
        answers = b"".join(client_stream.out)
        assert answers.count(b"HTTP/1.1 200 OK\r\n") == len(bodies), (case, answers)
        core.loop.close()
