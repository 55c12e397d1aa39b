"""HTTP/1.1 wire helpers of the endpoint proxy: head parsing, framing, chunk scanning.

Pure functions and small state machines, no I/O. Standard library only (Python 3.9+).
Header names and values stay ``bytes`` on the hot path; only the few headers the proxy acts
on are decoded.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

QUEUE_METRICS = ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "sglang:num_queue_reqs")
PREFIX_CACHE_METRICS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
# llama.cpp (--metrics): tokens evaluated, and tokens taken from a slot's cache
LLAMACPP_CACHE_METRICS = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")
# Headers that never cross the proxy (hop-by-hop, or set by the proxy itself).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"content-length",
        b"expect",
        b"host",
        b"x-synthbatch-affinity",  # read by the proxy (route.py), not for the engines
    }
)
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    408: "Request Timeout",
    413: "Content Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}
MAX_LINE = 8192
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")


class HttpError(Exception):
    """A request the proxy answers itself with an error status (and then closes)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Head:
    """A parsed request or response head.

    ``block`` keeps the end-to-end header lines verbatim, each one preceded by CRLF
    (hop-by-hop ones removed); ``framing`` is ``"chunked"``, ``"length"`` or ``"none"``
    (no framing header at all).
    """

    __slots__ = ("start", "block", "framing", "length", "conn_tokens", "expect", "bad_framing",
                 "affinity")

    def __init__(self, start: bytes, block: bytes) -> None:
        self.start = start
        self.block = block
        self.framing = "none"
        self.length = 0
        self.conn_tokens: Tuple[bytes, ...] = ()
        self.expect = False
        self.bad_framing = ""
        self.affinity = b""  # the affinity header's value (taken out of ``block``)


# One C-level pass validates the header lines; another finds the hop-by-hop ones. Only the
# names are matched case-insensitively (a scoped flag keeps the "\r\n" prefix search fast);
# possessive quantifiers (Python 3.11+) spare the validator its backtracking bookkeeping. A
# field value is any byte but NUL, CR and LF, spelled as ranges: the regex compiler turns
# ranges into a bitmap (one lookup per byte), ``[^\r\n\0]`` into three comparisons.
_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]"
_VALUE = rb"[\x01-\x09\x0b\x0c\x0e-\xff]"
_VALID_BLOCK = re.compile(
    rb"(?:\r\n" + _TOKEN + rb"++:" + _VALUE + rb"*+)*+"
    if sys.version_info >= (3, 11)
    else rb"(?:\r\n" + _TOKEN + rb"+:" + _VALUE + rb"*)*"
)
_HOP_LINE = re.compile(
    rb"\r\n((?i:c(?:onnection|ontent-length)|keep-alive|proxy-(?:connection|authenticate"
    rb"|authorization)|te|trailer|transfer-encoding|upgrade|expect|host|x-synthbatch-affinity))"
    rb":(" + _VALUE + rb"*)"
)
_CONTENT_LENGTH, _CONNECTION, _TRANSFER_ENCODING, _EXPECT, _AFFINITY = (
    b"content-length", b"connection", b"transfer-encoding", b"expect",
    b"x-synthbatch-affinity")  # the last: contracts.AFFINITY_HEADER, for the proxy only
_PLAIN_TOKENS = frozenset({b"close", b"keep-alive", b""})


def parse_head(block: bytes) -> Head:
    """Parse a head block (without the final blank line); ValueError when malformed."""
    eol = block.find(b"\r\n")
    if eol < 0:
        return Head(block, b"")
    rest = block[eol:]
    if _VALID_BLOCK.fullmatch(rest) is None:
        raise ValueError("malformed header line")
    parts = _HOP_LINE.split(rest)  # [kept, name, value, kept, name, value, kept, ...]
    if len(parts) == 1:
        return Head(block[:eol], rest)
    head = Head(block[:eol], b"".join(parts[::3]))
    te: Optional[bytes] = None
    length: Optional[bytes] = None
    lengths: Optional[List[bytes]] = None  # only when there is more than one
    conn: Tuple[bytes, ...] = ()
    named = False
    for i in range(1, len(parts), 3):
        lname = parts[i].lower()
        if lname == _CONTENT_LENGTH:
            if length is None:
                length = parts[i + 1]
            else:
                lengths = (lengths or [length]) + [parts[i + 1]]
        elif lname == _CONNECTION:
            value = parts[i + 1].strip().lower()
            if value == b"keep-alive" or value == b"close":
                conn += (value,)
            else:
                tokens = tuple([t.strip() for t in value.split(b",")])
                conn += tokens
                named = named or not _PLAIN_TOKENS.issuperset(tokens)
        elif lname == _TRANSFER_ENCODING:
            te = parts[i + 1].strip()
        elif lname == _EXPECT:
            head.expect = parts[i + 1].strip().lower() == b"100-continue"
        elif lname == _AFFINITY:
            head.affinity = parts[i + 1].strip()
    if conn:
        head.conn_tokens = conn
        if named:
            names = b"|".join(re.escape(n) for n in sorted(set(conn) - _PLAIN_TOKENS))
            drop = re.compile(rb"\r\n(?:" + names + rb"):" + _VALUE + rb"*", re.IGNORECASE)
            head.block = drop.sub(b"", head.block)
    if te is None and lengths is None and length is not None:
        text = length.strip()
        if text.isdigit() and len(text) <= 18:
            head.framing = "length"
            head.length = int(text)
            return head
    if te is not None or length is not None:
        try:
            head.framing, head.length = _framing(
                te, lengths or ([length] if length is not None else [])
            )
        except ValueError as exc:
            head.bad_framing = str(exc)
    return head


def _framing(te: Optional[bytes], lengths: List[bytes]) -> Tuple[str, int]:
    """Return the body framing from Transfer-Encoding / Content-Length values."""
    if te is not None:
        if lengths:
            raise ValueError("both Transfer-Encoding and Content-Length")
        if te.split(b",")[-1].strip().lower() != b"chunked":
            raise ValueError(f"unsupported Transfer-Encoding {te[:40]!r}")
        return "chunked", 0
    if not lengths:
        return "none", 0
    values = {v.strip() for v in b",".join(lengths).split(b",")}
    if len(values) != 1:
        raise ValueError("conflicting Content-Length")
    text = values.pop()
    if not text.isdigit() or len(text) > 18:
        raise ValueError(f"invalid Content-Length {text[:40]!r}")
    return "length", int(text)


# Request and status lines repeat (one API path, a handful of statuses): their parses are
# memoized, bounded in count and line length. Callers look a line up here first and call the
# parser (which fills the memo) only on a miss.
REQUEST_LINES: Dict[bytes, Tuple[bytes, bytes, bytes]] = {}
STATUS_LINES: Dict[bytes, Tuple[int, bytes, bytes]] = {}
MEMO_ENTRIES = 256
MEMO_LINE_BYTES = 256


def _remember(memo: Dict[bytes, Any], line: bytes, parsed: Any) -> None:
    """Keep a parse for reuse (the memo is emptied when full: no unbounded growth)."""
    if len(line) <= MEMO_LINE_BYTES:
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()
        memo[line] = parsed


def parse_request_line(line: bytes) -> Tuple[bytes, bytes, bytes]:
    """Split a request line into (METHOD, target, version); HttpError when invalid."""
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise HttpError(505, f"unsupported HTTP version {version[:20]!r}")
    if not target.startswith(b"/"):
        raise HttpError(400, "request target must be a path")
    parsed = (method.upper(), target, version)
    _remember(REQUEST_LINES, line, parsed)
    return parsed


def parse_status_line(line: bytes) -> Tuple[int, bytes, bytes]:
    """Split a status line into (status, version, reason); ValueError when invalid."""
    version, _, rest = line.partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ValueError(f"malformed status line {line[:80]!r}")
    parsed = (int(code), version, reason)
    _remember(STATUS_LINES, line, parsed)
    return parsed


def encode_head(start: str, headers: List[Tuple[str, str]]) -> bytes:
    """Serialize a start line and (name, value) headers."""
    lines = [start] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def json_error(message: str) -> bytes:
    """Build the OpenAI-style JSON error body."""
    return json.dumps({"error": {"message": message, "type": "proxy_error"}}).encode()


def simple_response(
    status: int,
    content_type: str,
    payload: bytes,
    close: bool,
    extra: Optional[List[Tuple[str, str]]] = None,
    head_only: bool = False,
) -> bytes:
    """A complete small response generated by the proxy itself."""
    headers = [("Content-Type", content_type), ("Content-Length", str(len(payload)))]
    headers += extra or []
    if close:
        headers.append(("Connection", "close"))
    data = encode_head(f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", headers)
    return data if head_only else data + payload


def error_response(status: int, message: str, close: bool, retry_after: str = "") -> bytes:
    """A JSON error answer."""
    extra = [("Retry-After", retry_after)] if retry_after else []
    return simple_response(status, "application/json", json_error(message), close, extra)


def chunk(data: bytes) -> bytes:
    """Encode one chunk of chunked transfer encoding."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class ChunkScanner:
    """Incremental scanner of a chunked body.

    ``feed(data)`` returns how many bytes of ``data`` belong to the body (everything up to
    the end of the trailers); ``done`` tells whether the body ended. ``size`` counts the
    decoded payload bytes; with ``decode`` the payload pieces are appended to ``out``.
    Raises ValueError on malformed framing.
    """

    __slots__ = ("state", "need", "line", "size", "decode", "out", "done")

    _SIZE, _DATA, _DATA_END, _TRAILER = range(4)

    def __init__(self, decode: bool = False) -> None:
        self.state = self._SIZE
        self.need = 0
        self.line = b""
        self.size = 0
        self.decode = decode
        self.out: List[bytes] = []
        self.done = False

    def feed(self, data: bytes) -> int:
        """Scan ``data``; return the number of bytes consumed."""
        pos, end = 0, len(data)
        while pos < end and not self.done:
            if self.state == self._DATA:
                take = min(self.need, end - pos)
                if self.decode:
                    self.out.append(data[pos : pos + take])
                pos += take
                self.need -= take
                self.size += take
                if not self.need:
                    self.state = self._DATA_END
                continue
            idx = data.find(b"\n", pos)
            if idx < 0:
                self.line += data[pos:]
                if len(self.line) > MAX_LINE:
                    raise ValueError("chunk line too long")
                return end
            line = self.line + data[pos:idx] if self.line else data[pos:idx]
            if line[-1:] == b"\r":
                line = line[:-1]
            if len(line) > MAX_LINE:
                raise ValueError("chunk line too long")
            self.line = b""
            pos = idx + 1
            self._line(line)
        return pos

    def _line(self, line: bytes) -> None:
        """Handle one complete framing line."""
        if self.state == self._SIZE:
            text = line.split(b";", 1)[0].strip()
            if _HEX.fullmatch(text) is None:
                raise ValueError(f"bad chunk size {text[:20]!r}")
            size = int(text, 16)
            self.state, self.need = (self._DATA, size) if size else (self._TRAILER, 0)
        elif self.state == self._DATA_END:
            if line:
                raise ValueError("missing CRLF after chunk data")
            self.state = self._SIZE
        elif not line:
            self.done = True
        else:
            self.size += len(line)  # trailers count against body limits


def parse_queue_metric(text: str) -> Optional[float]:
    """Sum the queue-length samples (e.g. ``vllm:num_requests_waiting``) over all labels.

    Returns None when the exposition contains no such metric.
    """
    sums = metric_sums(text, QUEUE_METRICS)
    return sum(sums.values()) if sums else None


def parse_prefix_cache(text: str) -> Optional[Tuple[float, float]]:
    """(queries, hits) of an engine's prefix cache, in tokens (vLLM's
    ``vllm:prefix_cache_queries_total`` and ``_hits_total``, summed over labels); None
    when the exposition has no such counters. llama.cpp's: queries are the tokens it
    evaluated plus those it took from a slot's cache (``llamacpp:prompt_tokens_total``,
    ``llamacpp:prompt_tokens_cached_total``)."""
    sums = metric_sums(text, PREFIX_CACHE_METRICS + LLAMACPP_CACHE_METRICS)
    if LLAMACPP_CACHE_METRICS[1] in sums:
        cached = sums[LLAMACPP_CACHE_METRICS[1]]
        return sums.get(LLAMACPP_CACHE_METRICS[0], 0.0) + cached, cached
    if PREFIX_CACHE_METRICS[0] not in sums:
        return None
    return sums[PREFIX_CACHE_METRICS[0]], sums.get(PREFIX_CACHE_METRICS[1], 0.0)


def metric_sums(text: str, names: Tuple[str, ...]) -> Dict[str, float]:
    """Each of ``names`` that the Prometheus exposition has, summed over its labels (the
    one parser of engine and proxy ``/metrics``; see also :func:`metric_by_label`)."""
    out: Dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _split_sample(line)
        if sample is None or sample[0] not in names:
            continue
        out[sample[0]] = out.get(sample[0], 0.0) + sample[1]
    return out


def metric_by_label(text: str, name: str, label: str) -> Dict[str, float]:
    """The samples of metric ``name`` by the value of its label ``label`` (summed when
    other labels differ); samples without that label are left out."""
    out: Dict[str, float] = {}
    needle = f'{label}="'
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith(name + "{"):
            continue
        sample = _split_sample(line)
        start = line.find(needle)
        if sample is None or sample[0] != name or start < 0:
            continue
        start += len(needle)
        key = line[start:line.find('"', start)]
        out[key] = out.get(key, 0.0) + sample[1]
    return out


def _split_sample(line: str) -> Optional[Tuple[str, float]]:
    """Parse one Prometheus sample line into (name, value); None if malformed."""
    brace = line.find("{")
    if brace >= 0:
        name, rest = line[:brace], line[line.rfind("}") + 1 :].split()
    else:
        fields = line.split()
        name, rest = fields[0], fields[1:]
    try:
        value = float(rest[0])
    except (IndexError, ValueError):
        return None
    return (name.strip(), value) if math.isfinite(value) else None
