"""HTTP head parsing of the endpoint proxy: framing, hop-by-hop removal, rejections."""

from __future__ import annotations

from typing import Tuple

import pytest

from agent_stdlib.proxy_http import HttpError, parse_head, parse_request_line, parse_status_line

# (head, kept header block, framing, length, connection tokens, expect, bad framing)
CASES = [
    (b"POST /v1/x HTTP/1.1\r\nHost: a:1\r\nContent-Length: 45\r\nContent-Type: application/json",
     b"\r\nContent-Type: application/json", "length", 45, (), False, ""),
    (b"HTTP/1.1 200 OK\r\nServer: x\r\ncontent-length: 80\r\nConnection: keep-alive",
     b"\r\nServer: x", "length", 80, (b"keep-alive",), False, ""),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1",
     b"\r\nX-A: 1", "chunked", 0, (), False, ""),
    (b"HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: gzip, chunked",
     b"", "chunked", 0, (), False, ""),
    (b"GET / HTTP/1.1\r\nConnection: X-Secret, close\r\nX-Secret: 1\r\nx-secret: 2\r\nKeep: y",
     b"\r\nKeep: y", "none", 0, (b"x-secret", b"close"), False, ""),
    (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5",
     b"", "length", 5, (), False, ""),
    (b"POST / HTTP/1.1\r\nContent-Length: 5, 6",
     b"", "none", 0, (), False, "conflicting Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked",
     b"", "none", 0, (), False, "both Transfer-Encoding and Content-Length"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip",
     b"", "none", 0, (), False, "unsupported Transfer-Encoding b'gzip'"),
    (b"POST / HTTP/1.1\r\nContent-Length:",
     b"", "none", 0, (), False, "invalid Content-Length b''"),
    (b"POST / HTTP/1.1\r\nContent-Length: -1",
     b"", "none", 0, (), False, "invalid Content-Length b'-1'"),
    (b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3",
     b"", "length", 3, (), True, ""),
    (b"GET / HTTP/1.1\r\nTE: trailers\r\nUpgrade: h2c\r\nProxy-Authorization: Basic x\r\n"
     b"Keep-Alive: 5\r\nProxy-Connection: x\r\nTrailer: y\r\nX-Te: 1\r\nHostname: h",
     b"\r\nX-Te: 1\r\nHostname: h", "none", 0, (), False, ""),
    (b"GET / HTTP/1.1", b"", "none", 0, (), False, ""),
]


@pytest.mark.parametrize("head, block, framing, length, tokens, expect, bad", CASES)
def test_parse_head(head: bytes, block: bytes, framing: str, length: int,
                    tokens: Tuple[bytes, ...], expect: bool, bad: str) -> None:
    parsed = parse_head(head)
    assert parsed.start == head.split(b"\r\n", 1)[0]
    assert (parsed.block, parsed.framing, parsed.length) == (block, framing, length)
    assert (parsed.conn_tokens, parsed.expect, parsed.bad_framing) == (tokens, expect, bad)


@pytest.mark.parametrize("head", [
    b"GET / HTTP/1.1\r\n folded",  # obs-fold
    b"GET / HTTP/1.1\r\nBad Name: x",
    b"GET / HTTP/1.1\r\nX: a\x00b",
    b"GET / HTTP/1.1\r\nX: a\rb",
    b"GET / HTTP/1.1\r\nNo-Colon",
    b"GET / HTTP/1.1\r\nX : spaced",
])
def test_malformed_header_lines_are_rejected(head: bytes) -> None:
    with pytest.raises(ValueError, match="malformed header line"):
        parse_head(head)


def test_request_and_status_lines() -> None:
    assert parse_request_line(b"post /x?y HTTP/1.0") == (b"POST", b"/x?y", b"HTTP/1.0")
    assert parse_status_line(b"HTTP/1.1 429 Too Many Requests") == (
        429, b"HTTP/1.1", b"Too Many Requests")
    with pytest.raises(HttpError) as err:
        parse_request_line(b"GET / HTTP/2.0")
    assert err.value.status == 505
    with pytest.raises(HttpError):
        parse_request_line(b"GET http://elsewhere/ HTTP/1.1")
    with pytest.raises(ValueError):
        parse_status_line(b"HTTP/1.1 2000 OK")
