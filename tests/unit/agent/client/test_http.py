"""The generator's HTTP client: keep-alive reuse, a stale idle connection, framings."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import List, Tuple

import pytest

from synthbatch.agent_stdlib.client.http import Endpoint, HttpError


class Canned:
    """A loopback server answering each request on a connection with the next reply;
    after ``close_after`` replies it closes the connection."""

    def __init__(self, replies: List[bytes], close_after: int = 1000) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.replies, self.close_after = replies, close_after
        self.connections = 0
        self.requests: List[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/prefix/"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        data, served = b"", 0
        with conn:
            while served < self.close_after:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                length = int([h.split(b":")[1] for h in head.split(b"\r\n")
                              if h.lower().startswith(b"content-length")][0])
                while len(data) < length:
                    data += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + data[:length])
                data = data[length:]
                conn.sendall(self.replies[len(self.requests) - 1]
                             if len(self.requests) <= len(self.replies) else self.replies[-1])
                served += 1


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


def post_many(endpoint: Endpoint, count: int) -> List[Tuple[int, bytes]]:
    async def go() -> List[Tuple[int, bytes]]:
        out = []
        for _ in range(count):
            reply = await endpoint.post("/v1/x", b'{"a": 1}')
            out.append((reply.status, reply.body))
        endpoint.close()
        return out
    return asyncio.run(go())


def test_keep_alive_reuses_one_connection_and_sends_the_prefix() -> None:
    server = Canned([OK])
    endpoint = Endpoint(server.url, api_key="k")
    assert post_many(endpoint, 3) == [(200, b"{}")] * 3
    assert server.connections == 1
    head = server.requests[0].split(b"\r\n")
    assert head[0] == b"POST /prefix/v1/x HTTP/1.1"
    assert b"Authorization: Bearer k" in head and b"Content-Length: 8" in head


def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    server = Canned([OK], close_after=1)
    assert post_many(Endpoint(server.url), 3) == [(200, b"{}")] * 3
    assert server.connections == 3


@pytest.mark.parametrize("reply,body", [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n"
     b"0\r\nTrailer: t\r\n\r\n", b"abcde"),
    (b"HTTP/1.0 503 Busy\r\nRetry-After: 2\r\n\r\nlater", b"later"),
])
def test_framings(reply: bytes, body: bytes) -> None:
    server = Canned([reply], close_after=1)
    out = post_many(Endpoint(server.url), 1)
    assert out[0][1] == body


def test_a_refused_connection_is_an_http_error() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(HttpError, match="connection to 127.0.0.1"):
        post_many(Endpoint(f"http://127.0.0.1:{port}"), 1)
    with pytest.raises(ValueError, match="not an http"):
        Endpoint("ftp://x")
