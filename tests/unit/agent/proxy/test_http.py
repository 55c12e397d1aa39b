"""HTTP head parsing of the endpoint proxy: framing, hop-by-hop removal, rejections."""

from __future__ import annotations

import random
from typing import Tuple

import pytest

from synthbatch.agent_stdlib.proxy import http as proxy_http
from synthbatch.agent_stdlib.proxy.http import (
    REQUEST_LINES,
    STATUS_LINES,
    HttpError,
    parse_head,
    parse_request_line,
    parse_status_line,
)

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



def test_line_parses_are_memoized_within_bounds() -> None:
    REQUEST_LINES.clear()
    STATUS_LINES.clear()
    assert parse_request_line(b"post /a HTTP/1.1") == (b"POST", b"/a", b"HTTP/1.1")
    assert REQUEST_LINES[b"post /a HTTP/1.1"] == (b"POST", b"/a", b"HTTP/1.1")
    assert parse_status_line(b"HTTP/1.1 200 OK") == STATUS_LINES[b"HTTP/1.1 200 OK"]
    with pytest.raises(HttpError):
        parse_request_line(b"GET /a HTTP/2.0")
    assert b"GET /a HTTP/2.0" not in REQUEST_LINES  # rejections are not remembered
    long_line = b"GET /" + b"x" * proxy_http.MEMO_LINE_BYTES + b" HTTP/1.1"
    parse_request_line(long_line)
    assert long_line not in REQUEST_LINES
    for i in range(proxy_http.MEMO_ENTRIES * 3):
        parse_request_line(b"GET /q?%d HTTP/1.1" % i)
        assert len(REQUEST_LINES) <= proxy_http.MEMO_ENTRIES
    assert b"GET /q?%d HTTP/1.1" % (proxy_http.MEMO_ENTRIES * 3 - 1) in REQUEST_LINES

HOP = {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
       b"transfer-encoding", b"upgrade", b"proxy-authenticate", b"proxy-authorization",
       b"content-length", b"expect", b"host"}
TOKEN = set(b"!#$%&'*+.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")


def reference(head: bytes) -> tuple:
    """A slow, line-by-line statement of what parse_head must return."""
    start, *lines = head.split(b"\r\n")
    kept, lengths, tokens, te, expect = [], [], [], None, False
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or not set(name) <= TOKEN or set(value) & set(b"\r\n\0"):
            raise ValueError("malformed header line")
        low = name.lower()
        if low not in HOP:
            kept.append((low, line))
        elif low == b"content-length":
            lengths.append(value)
        elif low == b"connection":
            tokens += [t.strip() for t in value.strip().lower().split(b",")]
        elif low == b"transfer-encoding":
            te = value.strip()
        elif low == b"expect":
            expect = value.strip().lower() == b"100-continue"
    named = set(tokens) - {b"close", b"keep-alive", b""}
    block = b"".join(b"\r\n" + line for low, line in kept if low not in named)
    framing, length, bad = "none", 0, ""
    values = {v.strip() for v in b",".join(lengths).split(b",")} if lengths else set()
    if te is not None and lengths:
        bad = "both Transfer-Encoding and Content-Length"
    elif te is not None:
        if te.split(b",")[-1].strip().lower() == b"chunked":
            framing = "chunked"
        else:
            bad = f"unsupported Transfer-Encoding {te[:40]!r}"
    elif len(values) > 1:
        bad = "conflicting Content-Length"
    elif values:
        text = values.pop()
        if text.isdigit() and len(text) <= 18:
            framing, length = "length", int(text)
        else:
            bad = f"invalid Content-Length {text[:40]!r}"
    return start, block, framing, length, tuple(tokens), expect, bad


def random_head(rng: random.Random) -> bytes:
    names = [b"Host", b"HOST", b"Content-Length", b"content-length", b"Connection", b"TE",
             b"Keep-Alive", b"Proxy-Connection", b"Trailer", b"Transfer-Encoding", b"Upgrade",
             b"Proxy-Authenticate", b"Proxy-Authorization", b"Expect", b"X-Foo", b"x-foo",
             b"Content-Type", b"X-Te", b"Tex", b"Hostname", b"Content-Lengths", b"Te-",
             b"Connection-X", b"bad name", b"", b"X\x00"]
    values = [b" 12", b"12", b" 12 ", b"12, 12", b"1,2", b" abc", b" close", b" Close",
              b" keep-alive", b" Keep-Alive, X-Foo", b" foo, bar", b" chunked",
              b" gzip, chunked", b" chunked, gzip", b" 100-continue", b"", b" x\x00y",
              b" 99999999999999999999", b" -1", b" +5", b" 007", b" x-foo", b"\tv", b" a b",
              b" \x0b\x0c\x01\x1f", b" \x7f\x80\xff", b" a\rb", b" a\nb", b"\r", b" \x00"]
    lines = [rng.choice([b"POST /v1/x HTTP/1.1", b"HTTP/1.1 200 OK"])]
    lines += [rng.choice(names) + b":" + rng.choice(values) for _ in range(rng.randint(0, 8))]
    if rng.random() < 0.05:
        lines.append(b" folded")
    return b"\r\n".join(lines)


def test_parse_head_agrees_with_the_line_by_line_reference() -> None:
    rng = random.Random(6)
    for _ in range(20000):
        head = random_head(rng)
        try:
            expected = reference(head)
        except ValueError:
            with pytest.raises(ValueError):
                parse_head(head)
            continue
        parsed = parse_head(head)
        got = (parsed.start, parsed.block, parsed.framing, parsed.length, parsed.conn_tokens,
               parsed.expect, parsed.bad_framing)
        assert got == expected, head
