"""Endpoint proxy between the generation client and the model replicas of one alias.

Runs inside the Slurm allocation on a loopback address. Standard library only (Python 3.9+).

Design:

* One thread accepts connections; every client connection gets its own thread, which reads
  requests one after the other (HTTP/1.1 keep-alive) with its own small buffered reader.
* Each request goes to the backend with the fewest outstanding requests (ties round-robin).
  Bodies are relayed piece by piece as they arrive (SSE chunks reach the client as soon as
  the backend sends them). The request body is also kept in memory (bounded by
  ``max_body_bytes``) so that it can be replayed to another backend on failover.
* Failover happens only before anything of the response has been sent to the client: on a
  connect error, or a 429/503 answer, the request is retried on another backend, each
  backend at most once. A backend that is idle-closed while pooled is retried on a fresh
  connection to the same backend (that does not count as a failover).
* While waiting for the backend, the client socket is watched as well: a client that goes
  away aborts the backend request (the backend sees its connection close).
* With ``max_queued`` set, a sampler thread polls every backend's ``/metrics`` and the
  proxy answers 429 + ``Retry-After: 1`` when every healthy backend is over the limit.
* ``GET /health`` and ``GET /metrics`` are answered by the proxy itself.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import logging
import math
import os
import select
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, Iterator, List, Optional, Set, Tuple
from urllib.parse import urlsplit

LOG = logging.getLogger("synthbatch.proxy")

QUEUE_METRICS = ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "sglang:num_queue_reqs")
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
        "content-length",
        "expect",
        "host",
    }
)
RETRIABLE_STATUS = (429, 503)
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
RECV_SIZE = 65536
MAX_LINE = 8192
MAX_ERROR_BODY = 65536
MAX_METRICS_BYTES = 8 * 1024 * 1024
POOL_IDLE_SECONDS = 2.0
EARLY_RESPONSE_WAIT = 1.0
LINGER_SECONDS = 1.0
LINGER_MAX_BYTES = 1024 * 1024


@dataclass
class ProxyConfig:
    """Settings of one proxy instance (one model alias)."""

    backends: List[str]
    host: str = "127.0.0.1"
    port: int = 0
    max_queued: Optional[int] = None
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 64 * 1024 * 1024
    header_timeout: float = 30.0
    idle_timeout: float = 120.0
    max_connections: int = 2048
    connect_timeout: float = 5.0
    read_timeout: float = 3600.0
    metrics_interval: float = 0.1
    fail_threshold: int = 3
    fail_window: float = 10.0
    down_seconds: float = 5.0
    allow_non_loopback: bool = False

    def validate(self) -> None:
        """Raise ValueError when the settings are unusable."""
        if not self.backends:
            raise ValueError("at least one backend is required")
        for url in self.backends:
            _parse_backend_url(url)
        if not self.allow_non_loopback and not _is_loopback(self.host):
            raise ValueError(f"listen host {self.host!r} is not a loopback address")
        if self.max_queued is not None and self.max_queued < 0:
            raise ValueError("max_queued must be >= 0")
        positive = (
            "max_header_bytes",
            "max_body_bytes",
            "max_connections",
            "header_timeout",
            "idle_timeout",
            "connect_timeout",
            "read_timeout",
            "metrics_interval",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")


# --------------------------------------------------------------------------------------
# Errors


class _HttpError(Exception):
    """A request the proxy answers itself with an error status."""

    def __init__(self, status: int, message: str, close: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close


class _ClientGone(Exception):
    """The client closed its connection or stopped reading."""


class _UpstreamError(Exception):
    """A backend exchange failed before a usable response head was read."""

    def __init__(self, message: str, retriable: bool, status: int = 502) -> None:
        super().__init__(message)
        self.retriable = retriable
        self.status = status


class _StaleConnection(Exception):
    """The backend connection died before any response byte arrived."""

    def __init__(self, message: str, sent_all: bool) -> None:
        super().__init__(message)
        self.sent_all = sent_all


class _Truncated(Exception):
    """A message ended before its declared length."""


# --------------------------------------------------------------------------------------
# Small helpers


def _is_loopback(host: str) -> bool:
    """Tell whether a listen host is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _parse_backend_url(url: str) -> Tuple[str, int, str]:
    """Split ``http://host:port[/prefix]`` into host, port and path prefix."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"backend URL must be http://host:port, got {url!r}")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def parse_queue_metric(text: str) -> Optional[float]:
    """Sum the queue-length samples (e.g. ``vllm:num_requests_waiting``) over all labels.

    Returns None when the exposition contains no such metric.
    """
    total: Optional[float] = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _split_sample(line)
        if sample is None or sample[0] not in QUEUE_METRICS:
            continue
        total = (total or 0.0) + sample[1]
    return total


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


def _json_error(message: str) -> bytes:
    """Build the OpenAI-style JSON error body."""
    return json.dumps({"error": {"message": message, "type": "proxy_error"}}).encode()


def _close_quietly(sock: Optional[socket.socket]) -> None:
    """Close a socket ignoring errors."""
    if sock is None:
        return
    try:
        sock.close()
    except OSError:
        pass


def _shutdown_quietly(sock: socket.socket) -> None:
    """Shut a socket down both ways (wakes up blocked readers), ignoring errors."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _parse_headers(lines: List[bytes]) -> List[Tuple[str, str]]:
    """Parse header lines into (name, value) pairs."""
    headers: List[Tuple[str, str]] = []
    for line in lines:
        if not line:
            continue
        if line[:1] in (b" ", b"\t"):
            raise ValueError("obsolete header folding")
        if b"\r" in line or b"\n" in line or b"\0" in line:
            raise ValueError("control character in header line")
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise ValueError("malformed header line")
        headers.append((name.decode("latin-1"), value.strip().decode("latin-1")))
    return headers


def _header(headers: List[Tuple[str, str]], name: str) -> Optional[str]:
    """Return the last value of a header (case-insensitive), or None."""
    found = None
    for key, value in headers:
        if key.lower() == name:
            found = value
    return found


def _connection_tokens(headers: List[Tuple[str, str]]) -> Set[str]:
    """Return the lower-case tokens of all Connection headers."""
    tokens: Set[str] = set()
    for key, value in headers:
        if key.lower() == "connection":
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


def _end_to_end(headers: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """Drop hop-by-hop headers (and the ones the proxy sets itself)."""
    drop = HOP_BY_HOP | _connection_tokens(headers)
    return [(k, v) for k, v in headers if k.lower() not in drop]


def _body_framing(headers: List[Tuple[str, str]]) -> Tuple[str, int]:
    """Return ("chunked", 0), ("length", n) or ("none", 0); ValueError if invalid."""
    te = _header(headers, "transfer-encoding")
    cl_values = [v for k, v in headers if k.lower() == "content-length"]
    if te is not None:
        if cl_values:
            raise ValueError("both Transfer-Encoding and Content-Length")
        if te.split(",")[-1].strip().lower() != "chunked":
            raise ValueError(f"unsupported Transfer-Encoding {te!r}")
        return "chunked", 0
    if not cl_values:
        return "none", 0
    lengths = {v.strip() for v in ",".join(cl_values).split(",")}
    if len(lengths) != 1:
        raise ValueError("conflicting Content-Length")
    text = lengths.pop()
    if not text.isdigit():
        raise ValueError(f"invalid Content-Length {text!r}")
    return "length", int(text)


def _encode_head(first_line: str, headers: List[Tuple[str, str]]) -> bytes:
    """Serialize a start line and headers."""
    lines = [first_line] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _chunk(data: bytes) -> bytes:
    """Encode one chunk of chunked transfer encoding."""
    return b"%x\r\n%s\r\n" % (len(data), data)


# --------------------------------------------------------------------------------------
# Socket reader


class _Reader:
    """Buffered reader over a socket with explicit per-call timeouts.

    ``watch`` (another reader, the client) is polled while this reader waits, so that a
    client that goes away is noticed even while the backend is silent.
    """

    def __init__(self, sock: socket.socket, on_bytes: Optional[Callable[[int], None]] = None):
        self.sock = sock
        self.buf = bytearray()
        self.on_bytes = on_bytes
        self.watch: Optional[_Reader] = None
        self.eof = False

    def _recv(self, timeout: Optional[float]) -> bool:
        """Receive more data into the buffer; False on EOF. Raises socket.timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.watch is not None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                self._wait_watching(left)
                self.sock.settimeout(0.0)
            else:
                self.sock.settimeout(timeout)
            try:
                data = self.sock.recv(RECV_SIZE)
            except BlockingIOError as exc:
                if self.watch is None:
                    raise socket.timeout("timed out") from exc
                continue
            break
        if self.on_bytes is not None and data:
            self.on_bytes(len(data))
        self.buf += data
        self.eof = not data
        return bool(data)

    def _wait_watching(self, timeout: Optional[float]) -> None:
        """Block until this socket is readable, watching the client for EOF meanwhile."""
        assert self.watch is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            poller = select.poll()
            poller.register(self.sock, select.POLLIN)
            if len(self.watch.buf) < MAX_LINE:
                poller.register(self.watch.sock, select.POLLIN)
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            events = poller.poll(None if wait is None else int(wait * 1000) + 1)
            fds = {fd for fd, _ in events}
            if self.watch.sock.fileno() in fds:
                self.watch.pull_or_gone()
            if self.sock.fileno() in fds:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise socket.timeout("timed out")

    def pull_or_gone(self) -> None:
        """Read what a readable socket has (pipelined data); raise _ClientGone on EOF."""
        try:
            if not self._recv(0.0):
                raise _ClientGone("client closed the connection")
        except socket.timeout:
            return
        except OSError as exc:
            raise _ClientGone(str(exc)) from exc

    def read_head(self, limit: int, deadline: float) -> bytes:
        """Read a header block up to the blank line; b"" on EOF before any byte.

        Raises _HttpError(431) over ``limit`` and socket.timeout past ``deadline``.
        """
        start = 0
        while True:
            while self.buf[:2] == b"\r\n":
                del self.buf[:2]
            idx = self.buf.find(b"\r\n\r\n", max(0, start - 3))
            if idx >= 0:
                if idx + 4 > limit:
                    raise _HttpError(431, "request header fields too large")
                head = bytes(self.buf[: idx + 4])
                del self.buf[: idx + 4]
                return head
            if len(self.buf) > limit:
                raise _HttpError(431, "request header fields too large")
            start = len(self.buf)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("header timeout")
            if not self._recv(remaining):
                if not self.buf:
                    return b""
                raise _Truncated("connection closed inside the header block")

    def read_line(self, timeout: Optional[float]) -> bytes:
        """Read one CRLF-terminated line (without the terminator)."""
        while True:
            idx = self.buf.find(b"\n")
            if idx >= 0:
                line = bytes(self.buf[:idx])
                del self.buf[: idx + 1]
                return line.rstrip(b"\r")
            if len(self.buf) > MAX_LINE:
                raise ValueError("line too long")
            if not self._recv(timeout):
                raise _Truncated("connection closed inside a line")

    def read_some(self, limit: int, timeout: Optional[float]) -> bytes:
        """Return up to ``limit`` bytes as soon as any are available; b"" on EOF."""
        if not self.buf and not self._recv(timeout):
            return b""
        data = bytes(self.buf[:limit])
        del self.buf[:limit]
        return data

    def wait_first_byte(self, timeout: float) -> bool:
        """Wait for the first byte of a next message; False on EOF or timeout."""
        if self.buf:
            return True
        try:
            return self._recv(timeout)
        except socket.timeout:
            return False


def _iter_length(reader: _Reader, length: int, timeout: Optional[float]) -> Iterator[bytes]:
    """Yield a Content-Length delimited body piece by piece."""
    remaining = length
    while remaining > 0:
        piece = reader.read_some(min(remaining, RECV_SIZE), timeout)
        if not piece:
            raise _Truncated("connection closed inside the body")
        remaining -= len(piece)
        yield piece


def _iter_chunked(reader: _Reader, timeout: Optional[float]) -> Iterator[bytes]:
    """Yield the decoded data of a chunked body piece by piece (trailers are dropped)."""
    while True:
        line = reader.read_line(timeout)
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size < 0:
            raise ValueError("negative chunk size")
        if size == 0:
            while reader.read_line(timeout):
                pass
            return
        yield from _iter_length(reader, size, timeout)
        if reader.read_line(timeout):
            raise ValueError("missing CRLF after chunk")


def _iter_until_eof(reader: _Reader, timeout: Optional[float]) -> Iterator[bytes]:
    """Yield a close-delimited body piece by piece."""
    while True:
        piece = reader.read_some(RECV_SIZE, timeout)
        if not piece:
            return
        yield piece


# --------------------------------------------------------------------------------------
# Requests, bodies, backends


@dataclass
class _Request:
    """A parsed client request head."""

    method: str
    target: str
    version: str
    headers: List[Tuple[str, str]]
    framing: str
    length: int

    @property
    def keep_alive(self) -> bool:
        """Whether the client wants the connection kept open after this request."""
        tokens = _connection_tokens(self.headers)
        if self.version == "HTTP/1.1":
            return "close" not in tokens
        return "keep-alive" in tokens


class _Body:
    """Request body read from the client once, recorded so it can be replayed on retry."""

    def __init__(self, source: Iterator[bytes], limit: int) -> None:
        self.source = source
        self.limit = limit
        self.record: List[bytes] = []
        self.size = 0
        self.done = False

    def pieces(self) -> Iterator[bytes]:
        """Yield what was already read, then continue reading from the client."""
        yield from list(self.record)
        while not self.done:
            try:
                piece = next(self.source)
            except StopIteration:
                self.done = True
                return
            except socket.timeout as exc:
                raise _HttpError(408, "timed out reading the request body") from exc
            except (_Truncated, OSError) as exc:
                raise _ClientGone(f"client body read failed: {exc}") from exc
            except ValueError as exc:
                raise _HttpError(400, f"bad chunked body: {exc}") from exc
            self.size += len(piece)
            if self.size > self.limit:
                raise _HttpError(413, f"request body exceeds {self.limit} bytes")
            self.record.append(piece)
            yield piece

    def drain(self) -> None:
        """Read (and keep) the rest of the body."""
        for _ in self.pieces():
            pass


class _Backend:
    """State of one backend replica."""

    def __init__(self, url: str, index: int) -> None:
        self.url = url.rstrip("/")
        self.index = index
        self.host, self.port, self.prefix = _parse_backend_url(url)
        self.in_flight = 0
        self.requests = 0
        self.failures: Deque[float] = deque()
        self.down_until = 0.0
        self.marked_down = False
        self.sample_ok_at = 0.0
        self.sampled_waiting: Optional[float] = None
        self.pool: List[Tuple[_UpConn, float]] = []

    @property
    def netloc(self) -> str:
        """Host header value for this backend."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class _UpConn:
    """One connection to a backend."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = _Reader(sock)

    def idle_ok(self) -> bool:
        """Whether a pooled connection still looks usable (no EOF/stray data pending)."""
        if self.reader.buf:
            return False
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return not poller.poll(0)

    def close(self) -> None:
        """Close the connection."""
        _close_quietly(self.sock)


@dataclass
class _UpResponse:
    """A parsed backend response head (and, for retriable answers, its small body)."""

    status: int
    reason: str
    version: str
    headers: List[Tuple[str, str]]
    body: bytes = b""

    @property
    def keep_alive(self) -> bool:
        """Whether the backend allows reusing the connection."""
        tokens = _connection_tokens(self.headers)
        return self.version == "HTTP/1.1" and "close" not in tokens


@dataclass
class _Stats:
    """Proxy-wide counters for the own /metrics endpoint."""

    requests_total: int = 0
    retries_total: int = 0
    rejected_429_total: int = 0
    passthrough_429_total: int = 0
    errors_total: Dict[int, int] = field(default_factory=dict)
    bytes_in: int = 0
    bytes_out: int = 0


# --------------------------------------------------------------------------------------
# The proxy


class Proxy:
    """Least-outstanding-requests HTTP proxy in front of the replicas of one model alias."""

    def __init__(self, config: ProxyConfig) -> None:
        config.validate()
        self.config = config
        self.backends = [_Backend(url, i) for i, url in enumerate(config.backends)]
        self.stats = _Stats()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._rr = 0
        self._listener: Optional[socket.socket] = None
        self._threads: List[threading.Thread] = []
        self._clients: Dict[socket.socket, threading.Thread] = {}
        self._upstream_active: Set[_UpConn] = set()
        self.port = 0

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> int:
        """Bind the listener, start the accept (and sampler) threads; return the bound port."""
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.config.host.strip("[]"), self.config.port))
            listener.listen(min(self.config.max_connections, 1024))
        except OSError:
            listener.close()
            raise
        listener.settimeout(0.2)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._spawn(self._accept_loop, "proxy-accept")
        if self.config.max_queued is not None:
            self._spawn(self._sample_loop, "proxy-sampler")
        LOG.info(
            "listening on %s:%d backends=%s max_queued=%s",
            self.config.host,
            self.port,
            ",".join(b.url for b in self.backends),
            self.config.max_queued,
        )
        return self.port

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every connection, then join all threads."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._listener is not None:
            _shutdown_quietly(self._listener)  # wakes the accept loop on Linux
            _close_quietly(self._listener)
        with self._lock:
            clients = list(self._clients.items())
            upstream = list(self._upstream_active)
            pooled = [c for b in self.backends for c, _ in b.pool]
            for b in self.backends:
                b.pool.clear()
        for sock, _ in clients:
            _shutdown_quietly(sock)
        for conn in upstream:
            _shutdown_quietly(conn.sock)
        for conn in pooled:
            conn.close()
        deadline = time.monotonic() + timeout
        for thread in self._threads + [t for _, t in clients]:
            thread.join(max(0.0, deadline - time.monotonic()))
        LOG.info("stopped")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        """Start a daemon thread owned by the proxy."""
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    # ---- accepting -------------------------------------------------------------------

    def _accept_loop(self) -> None:
        """Accept client connections until stopped."""
        assert self._listener is not None
        last_reap = time.monotonic()
        while not self._stopping.is_set():
            if time.monotonic() - last_reap >= POOL_IDLE_SECONDS / 2:
                self._reap_pool()
                last_reap = time.monotonic()
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if self._stopping.is_set():
                    return
                LOG.warning("accept failed: %s", exc)
                time.sleep(0.05)
                continue
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        """Start a thread for a new client, or refuse it when at the connection limit."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        thread = threading.Thread(target=self._serve_client, args=(sock,), daemon=True)
        with self._lock:
            if self._stopping.is_set():
                _close_quietly(sock)
                return
            full = len(self._clients) >= self.config.max_connections
            if not full:
                self._clients[sock] = thread
        if full:
            self._refuse(sock)
            return
        thread.start()

    def _refuse(self, sock: socket.socket) -> None:
        """Answer 503 on a connection over the limit and close it."""
        body = _json_error("too many client connections")
        head = _encode_head(
            "HTTP/1.1 503 Service Unavailable",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Retry-After", "1"),
                ("Connection", "close"),
            ],
        )
        try:
            sock.settimeout(0.5)
            sock.sendall(head + body)
        except OSError:
            pass
        _close_quietly(sock)

    # ---- one client connection --------------------------------------------------------

    def _serve_client(self, sock: socket.socket) -> None:
        """Serve the requests of one client connection (keep-alive loop)."""
        client = _Reader(sock, self._count_in)
        try:
            first = True
            while not self._stopping.is_set():
                if not first and not client.wait_first_byte(self.config.idle_timeout):
                    return
                first = False
                if not self._serve_one(client):
                    return
        except (_ClientGone, OSError):
            return
        finally:
            with self._lock:
                self._clients.pop(sock, None)
            self._linger_close(client)

    def _linger_close(self, client: _Reader) -> None:
        """Close a client socket, first draining what it still sends (avoids an RST that
        would destroy an error answer the client has not read yet)."""
        sock = client.sock
        if not client.eof and not self._stopping.is_set():
            try:
                sock.shutdown(socket.SHUT_WR)
                deadline = time.monotonic() + LINGER_SECONDS
                drained = 0
                while drained < LINGER_MAX_BYTES:
                    sock.settimeout(max(0.01, deadline - time.monotonic()))
                    data = sock.recv(RECV_SIZE)
                    if not data:
                        break
                    drained += len(data)
            except OSError:
                pass
        _close_quietly(sock)

    def _serve_one(self, client: _Reader) -> bool:
        """Read and answer one request; return whether to keep the connection."""
        try:
            req = self._read_request(client)
        except _HttpError as exc:
            self._send_error(client.sock, exc.status, exc.message, close=True)
            return False
        except socket.timeout:
            if client.buf:
                self._send_error(client.sock, 408, "timed out reading the request head", True)
            return False
        except _Truncated:
            return False
        if req is None:
            return False
        with self._lock:
            self.stats.requests_total += 1
        try:
            return self._dispatch(client, req)
        except _HttpError as exc:
            self._send_error(client.sock, exc.status, exc.message, close=True)
            return False

    def _read_request(self, client: _Reader) -> Optional[_Request]:
        """Read and parse a request head; None on a clean close before any byte."""
        deadline = time.monotonic() + self.config.header_timeout
        head = client.read_head(self.config.max_header_bytes, deadline)
        if not head:
            return None
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].decode("latin-1").split()
        if len(parts) != 3:
            raise _HttpError(400, "malformed request line")
        method, target, version = parts
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            raise _HttpError(505, f"unsupported HTTP version {version}")
        try:
            headers = _parse_headers(lines[1:])
            framing, length = _body_framing(headers)
        except ValueError as exc:
            raise _HttpError(400, str(exc)) from exc
        if length > self.config.max_body_bytes:
            raise _HttpError(413, f"request body exceeds {self.config.max_body_bytes} bytes")
        if target.startswith(("http://", "https://")):
            target = "/" + target.split("://", 1)[1].partition("/")[2]
        if not target.startswith("/"):
            raise _HttpError(400, "request target must be a path")
        return _Request(method.upper(), target, version, headers, framing, length)

    def _client_body(self, client: _Reader, req: _Request) -> _Body:
        """Create the replayable body reader for a request."""
        timeout = self.config.header_timeout
        if req.framing == "chunked":
            source: Iterator[bytes] = _iter_chunked(client, timeout)
        elif req.framing == "length":
            source = _iter_length(client, req.length, timeout)
        else:
            source = iter(())
        return _Body(source, self.config.max_body_bytes)

    def _dispatch(self, client: _Reader, req: _Request) -> bool:
        """Answer own endpoints, apply backpressure, or proxy the request."""
        body = self._client_body(client, req)
        if (_header(req.headers, "expect") or "").lower() == "100-continue":
            self._send_raw(client.sock, b"HTTP/1.1 100 Continue\r\n\r\n")
        path = req.target.split("?", 1)[0]
        if req.method in ("GET", "HEAD") and path in ("/health", "/metrics"):
            body.drain()
            if path == "/health":
                return self._serve_health(client, req)
            return self._serve_metrics(client, req)
        if self._all_over_limit():
            body.drain()
            with self._lock:
                self.stats.rejected_429_total += 1
            self._send_error(
                client.sock,
                429,
                "all backends are over their queue limit",
                close=not req.keep_alive,
                retry_after="1",
            )
            return req.keep_alive
        return self._forward(client, req, body)

    # ---- own endpoints ----------------------------------------------------------------

    def health(self) -> Dict[str, object]:
        """Return the health document served at ``GET /health``."""
        now = time.monotonic()
        with self._lock:
            rows = [
                {
                    "url": b.url,
                    "healthy": now >= b.down_until,
                    "in_flight": b.in_flight,
                    "requests": b.requests,
                    "queued": self._queued_locked(b, now),
                }
                for b in self.backends
            ]
        ok = any(r["healthy"] for r in rows)
        return {"status": "ok" if ok else "unavailable", "backends": rows}

    def _serve_health(self, client: _Reader, req: _Request) -> bool:
        """Answer ``GET /health``: 200 when at least one backend is healthy, else 503."""
        doc = self.health()
        status = 200 if doc["status"] == "ok" else 503
        payload = json.dumps(doc).encode()
        self._send_simple(client.sock, req, status, "application/json", payload)
        return req.keep_alive

    def _serve_metrics(self, client: _Reader, req: _Request) -> bool:
        """Answer ``GET /metrics`` with the proxy's own counters."""
        payload = self.metrics_text().encode()
        self._send_simple(client.sock, req, 200, "text/plain; version=0.0.4", payload)
        return req.keep_alive

    def metrics_text(self) -> str:
        """Render the proxy's counters in Prometheus text format."""
        p = "synthbatch_proxy_"
        now = time.monotonic()
        with self._lock:
            s = self.stats
            out = [
                f"# TYPE {p}requests_total counter",
                f"{p}requests_total {s.requests_total}",
                f"# TYPE {p}retries_total counter",
                f"{p}retries_total {s.retries_total}",
                f"# TYPE {p}responses_429_total counter",
                f'{p}responses_429_total{{source="proxy"}} {s.rejected_429_total}',
                f'{p}responses_429_total{{source="backend"}} {s.passthrough_429_total}',
                f"# TYPE {p}errors_total counter",
            ]
            errors = sorted(s.errors_total.items())
            out += [f'{p}errors_total{{status="{k}"}} {v}' for k, v in errors]
            out += [
                f"# TYPE {p}bytes_in_total counter",
                f"{p}bytes_in_total {s.bytes_in}",
                f"# TYPE {p}bytes_out_total counter",
                f"{p}bytes_out_total {s.bytes_out}",
                f"# TYPE {p}client_connections gauge",
                f"{p}client_connections {len(self._clients)}",
            ]
            for name, kind, fn in (
                ("in_flight", "gauge", lambda b: b.in_flight),
                ("backend_requests_total", "counter", lambda b: b.requests),
                ("backend_healthy", "gauge", lambda b: int(now >= b.down_until)),
                ("backend_queued", "gauge", lambda b: self._queued_locked(b, now)),
            ):
                out.append(f"# TYPE {p}{name} {kind}")
                for b in self.backends:
                    value = fn(b)
                    if value is not None:
                        out.append(f'{p}{name}{{backend="{b.url}"}} {value}')
        return "\n".join(out) + "\n"

    # ---- routing and health -----------------------------------------------------------

    def _queued_locked(self, b: _Backend, now: float) -> Optional[float]:
        """Queue length used for backpressure; None when unknown (fail open)."""
        if self.config.max_queued is None:
            return float(b.in_flight)
        stale_after = max(1.0, 10 * self.config.metrics_interval)
        if now - b.sample_ok_at > stale_after:
            return None
        if b.sampled_waiting is not None:
            return b.sampled_waiting
        return float(b.in_flight)

    def _over_locked(self, b: _Backend, now: float) -> bool:
        """Whether a backend is over ``max_queued``."""
        if self.config.max_queued is None:
            return False
        queued = self._queued_locked(b, now)
        return queued is not None and queued > self.config.max_queued

    def _all_over_limit(self) -> bool:
        """True when every healthy backend is over its queue limit."""
        if self.config.max_queued is None:
            return False
        now = time.monotonic()
        with self._lock:
            healthy = [b for b in self.backends if now >= b.down_until]
            return bool(healthy) and all(self._over_locked(b, now) for b in healthy)

    def _pick(self, tried: Set[int]) -> Optional[_Backend]:
        """Choose the untried backend with the fewest outstanding requests (ties round-robin).

        Healthy backends come first; backends marked down are tried only when all are down.
        The chosen backend's in-flight count is incremented.
        """
        now = time.monotonic()
        with self._lock:
            untried = [b for b in self.backends if b.index not in tried]
            healthy = [b for b in untried if now >= b.down_until]
            all_down = all(now < b.down_until for b in self.backends)
            candidates = healthy or (untried if all_down else [])
            if not candidates:
                return None
            n = len(self.backends)
            start = self._rr
            best = min(
                candidates,
                key=lambda b: (self._over_locked(b, now), b.in_flight, (b.index - start) % n),
            )
            self._rr = (best.index + 1) % n
            best.in_flight += 1
            best.requests += 1
            return best

    def _release(self, b: _Backend) -> None:
        """Decrement a backend's in-flight count."""
        with self._lock:
            b.in_flight -= 1

    def _note_failure(self, b: _Backend, why: str) -> None:
        """Record a connect failure; mark the backend down after too many in the window."""
        now = time.monotonic()
        with self._lock:
            b.failures.append(now)
            while b.failures and now - b.failures[0] > self.config.fail_window:
                b.failures.popleft()
            if len(b.failures) < self.config.fail_threshold or now < b.down_until:
                return
            b.down_until = now + self.config.down_seconds
            b.failures.clear()
            newly = not b.marked_down
            b.marked_down = True
        if newly:
            LOG.warning("backend %s marked down (%s)", b.url, why)

    def _note_success(self, b: _Backend) -> None:
        """Record a successful connect; log when a backend comes back up."""
        with self._lock:
            was_down = b.marked_down
            b.marked_down = False
            b.down_until = 0.0
            b.failures.clear()
        if was_down:
            LOG.info("backend %s marked up", b.url)

    # ---- backend connections ----------------------------------------------------------

    def _pool_get(self, b: _Backend) -> Optional[_UpConn]:
        """Take a recently used idle connection to the backend, if any."""
        now = time.monotonic()
        while True:
            with self._lock:
                if not b.pool:
                    return None
                conn, since = b.pool.pop()
                fresh = now - since < POOL_IDLE_SECONDS
                if fresh:
                    self._upstream_active.add(conn)
            if fresh and conn.idle_ok():
                return conn
            self._discard(conn)

    def _reap_pool(self) -> None:
        """Close pooled backend connections that have been idle too long."""
        now = time.monotonic()
        stale: List[_UpConn] = []
        with self._lock:
            for b in self.backends:
                keep = [(c, t) for c, t in b.pool if now - t < POOL_IDLE_SECONDS]
                stale += [c for c, t in b.pool if now - t >= POOL_IDLE_SECONDS]
                b.pool[:] = keep
        for conn in stale:
            conn.close()

    def _pool_put(self, b: _Backend, conn: _UpConn) -> None:
        """Return a connection whose response was fully read to the idle pool."""
        with self._lock:
            self._upstream_active.discard(conn)
            if not self._stopping.is_set() and len(b.pool) < 64:
                b.pool.append((conn, time.monotonic()))
                return
        conn.close()

    def _discard(self, conn: _UpConn) -> None:
        """Close a backend connection and forget it."""
        with self._lock:
            self._upstream_active.discard(conn)
        conn.close()

    def _connect(self, b: _Backend) -> _UpConn:
        """Open a fresh connection to a backend; raises a retriable _UpstreamError."""
        try:
            sock = socket.create_connection((b.host, b.port), timeout=self.config.connect_timeout)
        except OSError as exc:
            self._note_failure(b, f"connect: {exc}")
            raise _UpstreamError(f"connect to {b.url} failed: {exc}", retriable=True) from exc
        self._note_success(b)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _UpConn(sock)
        with self._lock:
            self._upstream_active.add(conn)
        return conn

    def _request_head(self, b: _Backend, req: _Request) -> bytes:
        """Serialize the request head sent to a backend."""
        headers = [("Host", b.netloc)] + _end_to_end(req.headers)
        if req.framing == "chunked":
            headers.append(("Transfer-Encoding", "chunked"))
        elif req.framing == "length":
            headers.append(("Content-Length", str(req.length)))
        return _encode_head(f"{req.method} {b.prefix}{req.target} HTTP/1.1", headers)

    def _send_request(self, conn: _UpConn, b: _Backend, req: _Request, body: _Body) -> None:
        """Send head and body to the backend; backend errors raise OSError."""
        conn.sock.settimeout(self.config.read_timeout)
        conn.sock.sendall(self._request_head(b, req))
        chunked = req.framing == "chunked"
        for piece in body.pieces():
            conn.sock.sendall(_chunk(piece) if chunked else piece)
        if chunked:
            conn.sock.sendall(b"0\r\n\r\n")

    def _read_response_head(self, conn: _UpConn, timeout: float) -> _UpResponse:
        """Read a final (non-1xx) response head from the backend."""
        while True:
            head = conn.reader.read_head(self.config.max_header_bytes, time.monotonic() + timeout)
            if not head:
                raise _Truncated("backend closed the connection")
            lines = head[:-4].split(b"\r\n")
            version, _, rest = lines[0].decode("latin-1").partition(" ")
            code, _, reason = rest.partition(" ")
            if not version.startswith("HTTP/1.") or not code.isdigit():
                raise ValueError(f"malformed status line {lines[0][:80]!r}")
            status = int(code)
            if status >= 200 or status == 101:
                return _UpResponse(status, reason, version, _parse_headers(lines[1:]))

    def _exchange_once(
        self, conn: _UpConn, b: _Backend, req: _Request, body: _Body, client: _Reader
    ) -> _UpResponse:
        """Send the request on one connection and read the response head.

        Raises _StaleConnection when the backend produced no response byte at all.
        """
        try:
            self._send_request(conn, b, req, body)
        except socket.timeout as exc:
            raise _UpstreamError("timed out sending to the backend", False, 504) from exc
        except OSError as exc:
            try:  # the backend may have answered early (e.g. 429) and closed
                return self._read_response_head(conn, EARLY_RESPONSE_WAIT)
            except (OSError, ValueError, _Truncated, _HttpError):
                raise _StaleConnection(f"send failed: {exc}", sent_all=False) from exc
        conn.reader.watch = client
        try:
            return self._read_response_head(conn, self.config.read_timeout)
        except socket.timeout as exc:
            raise _UpstreamError("timed out waiting for the backend", False, 504) from exc
        except (_Truncated, ConnectionResetError) as exc:
            if conn.reader.buf:
                raise _UpstreamError(f"bad response from backend: {exc}", False) from exc
            raise _StaleConnection(str(exc), sent_all=True) from exc
        except (OSError, ValueError, _HttpError) as exc:
            raise _UpstreamError(f"bad response from backend: {exc}", False) from exc
        finally:
            conn.reader.watch = None

    def _exchange(
        self, b: _Backend, req: _Request, body: _Body, client: _Reader
    ) -> Tuple[_UpConn, _UpResponse]:
        """Run the exchange on a pooled connection (if any), else on a fresh one."""
        conn = self._pool_get(b)
        if conn is not None:
            try:
                return conn, self._exchange_once(conn, b, req, body, client)
            except _StaleConnection:
                self._discard(conn)
            except BaseException:
                self._discard(conn)
                raise
        conn = self._connect(b)
        try:
            return conn, self._exchange_once(conn, b, req, body, client)
        except _StaleConnection as exc:
            self._discard(conn)
            # A request that was not completely sent cannot have been processed: retriable.
            raise _UpstreamError(f"{b.url}: {exc}", retriable=not exc.sent_all) from exc
        except BaseException:
            self._discard(conn)
            raise

    def _read_small_body(self, conn: _UpConn, resp: _UpResponse, req: _Request) -> bool:
        """Read a retriable answer's body into ``resp.body``; True if the connection is reusable."""
        pieces: List[bytes] = []
        size = 0
        try:
            for piece in self._response_pieces(conn, resp, req):
                pieces.append(piece)
                size += len(piece)
                if size > MAX_ERROR_BODY:
                    resp.body = b"".join(pieces)[:MAX_ERROR_BODY]
                    return False
        except (OSError, ValueError, _Truncated):
            resp.body = b"".join(pieces)
            return False
        resp.body = b"".join(pieces)
        return resp.keep_alive and _body_framing_safe(resp.headers) != "none"

    def _response_pieces(self, conn: _UpConn, resp: _UpResponse, req: _Request) -> Iterator[bytes]:
        """Iterate over the backend's response body."""
        if req.method == "HEAD" or resp.status in (204, 304):
            return iter(())
        framing = _body_framing_safe(resp.headers)
        timeout = self.config.read_timeout
        if framing == "chunked":
            return _iter_chunked(conn.reader, timeout)
        if framing == "length":
            return _iter_length(conn.reader, _body_framing(resp.headers)[1], timeout)
        return _iter_until_eof(conn.reader, timeout)

    # ---- forwarding -------------------------------------------------------------------

    def _forward(self, client: _Reader, req: _Request, body: _Body) -> bool:
        """Proxy one request with failover; return whether to keep the client connection."""
        tried: Set[int] = set()
        last_retriable: Optional[_UpResponse] = None
        last_error = "no backend available"
        while True:
            b = self._pick(tried)
            if b is None:
                break
            if tried:
                with self._lock:
                    self.stats.retries_total += 1
            tried.add(b.index)
            try:
                conn, resp = self._exchange(b, req, body, client)
            except _UpstreamError as exc:
                self._release(b)
                last_error = str(exc)
                if exc.retriable:
                    continue
                self._send_error(client.sock, exc.status, last_error, close=True)
                return False
            except BaseException:
                self._release(b)
                raise
            if resp.status in RETRIABLE_STATUS:
                if self._read_small_body(conn, resp, req):
                    self._pool_put(b, conn)
                else:
                    self._discard(conn)
                self._release(b)
                last_retriable = resp
                last_error = f"{b.url} answered {resp.status}"
                continue
            try:
                return self._relay(client, req, body, b, conn, resp)
            finally:
                self._release(b)
        if last_retriable is not None:
            return self._pass_through(client, req, body, last_retriable)
        self._send_error(client.sock, 502, f"all backends failed: {last_error}", close=True)
        return False

    def _relay(
        self,
        client: _Reader,
        req: _Request,
        body: _Body,
        b: _Backend,
        conn: _UpConn,
        resp: _UpResponse,
    ) -> bool:
        """Stream the backend response to the client; return whether to keep the client."""
        if resp.status == 101:
            self._discard(conn)
            self._send_error(client.sock, 502, "protocol upgrades are not supported", close=True)
            return False
        keep = req.keep_alive and body.done
        framing = _body_framing_safe(resp.headers)
        no_body = req.method == "HEAD" or resp.status in (204, 304)
        headers = _end_to_end(resp.headers)
        if framing == "length":
            headers.append(("Content-Length", str(_body_framing(resp.headers)[1])))
        elif not no_body and req.version == "HTTP/1.1":
            headers.append(("Transfer-Encoding", "chunked"))
        elif not no_body:
            keep = False
        if not keep:
            headers.append(("Connection", "close"))
        chunked_out = not no_body and framing != "length" and req.version == "HTTP/1.1"
        if resp.status == 429:
            with self._lock:
                self.stats.passthrough_429_total += 1
        conn.reader.watch = client
        try:
            self._send_raw(
                client.sock, _encode_head(f"HTTP/1.1 {resp.status} {resp.reason}", headers)
            )
            for piece in self._response_pieces(conn, resp, req):
                self._send_raw(client.sock, _chunk(piece) if chunked_out else piece)
            if chunked_out:
                self._send_raw(client.sock, b"0\r\n\r\n")
        except (_ClientGone, OSError, ValueError, _Truncated) as exc:
            LOG.debug("relay from %s aborted: %s", b.url, exc)
            self._discard(conn)
            return False
        finally:
            conn.reader.watch = None
        if resp.keep_alive and framing != "none":
            self._pool_put(b, conn)
        else:
            self._discard(conn)
        return keep

    def _pass_through(self, client: _Reader, req: _Request, body: _Body, resp: _UpResponse) -> bool:
        """Send the last retriable (429/503) backend answer to the client."""
        keep = req.keep_alive and body.done
        headers = _end_to_end(resp.headers)
        headers.append(("Content-Length", str(len(resp.body))))
        if not keep:
            headers.append(("Connection", "close"))
        with self._lock:
            if resp.status == 429:
                self.stats.passthrough_429_total += 1
        payload = b"" if req.method == "HEAD" else resp.body
        self._send_raw(
            client.sock, _encode_head(f"HTTP/1.1 {resp.status} {resp.reason}", headers) + payload
        )
        return keep

    # ---- writing to the client --------------------------------------------------------

    def _count_in(self, n: int) -> None:
        """Count bytes received from clients."""
        with self._lock:
            self.stats.bytes_in += n

    def _send_raw(self, sock: socket.socket, data: bytes) -> None:
        """Send bytes to the client; raise _ClientGone when it cannot take them."""
        try:
            sock.settimeout(self.config.read_timeout)
            sock.sendall(data)
        except OSError as exc:
            raise _ClientGone(str(exc)) from exc
        with self._lock:
            self.stats.bytes_out += len(data)

    def _send_simple(
        self,
        sock: socket.socket,
        req: Optional[_Request],
        status: int,
        content_type: str,
        payload: bytes,
        close: bool = False,
        extra: Optional[List[Tuple[str, str]]] = None,
    ) -> None:
        """Send a complete small response generated by the proxy itself."""
        headers = [("Content-Type", content_type), ("Content-Length", str(len(payload)))]
        headers += extra or []
        if close or (req is not None and not req.keep_alive):
            headers.append(("Connection", "close"))
        reason = REASONS.get(status, "Unknown")
        data = _encode_head(f"HTTP/1.1 {status} {reason}", headers)
        if req is None or req.method != "HEAD":
            data += payload
        self._send_raw(sock, data)

    def _send_error(
        self,
        sock: socket.socket,
        status: int,
        message: str,
        close: bool,
        retry_after: Optional[str] = None,
    ) -> None:
        """Send a JSON error answer (best effort)."""
        with self._lock:
            self.stats.errors_total[status] = self.stats.errors_total.get(status, 0) + 1
        extra = [("Retry-After", retry_after)] if retry_after else []
        try:
            self._send_simple(
                sock,
                None,
                status,
                "application/json",
                _json_error(message),
                close=close,
                extra=extra,
            )
        except _ClientGone:
            pass

    # ---- metrics sampler --------------------------------------------------------------

    def _sample_loop(self) -> None:
        """Poll every backend's /metrics about every ``metrics_interval`` seconds."""
        conns: Dict[int, http.client.HTTPConnection] = {}
        try:
            while not self._stopping.wait(self.config.metrics_interval):
                for b in self.backends:
                    if self._stopping.is_set():
                        break
                    try:
                        self._sample_one(b, conns)
                    except Exception as exc:  # never let the sampler die
                        LOG.debug("sampling %s failed: %s", b.url, exc)
        finally:
            for conn in conns.values():
                conn.close()

    def _sample_one(self, b: _Backend, conns: Dict[int, http.client.HTTPConnection]) -> None:
        """Take one queue sample of a backend; errors leave the sample unknown."""
        conn = conns.get(b.index)
        if conn is None:
            timeout = min(1.0, max(0.2, 5 * self.config.metrics_interval))
            conn = http.client.HTTPConnection(b.host, b.port, timeout=timeout)
            conns[b.index] = conn
        try:
            conn.request("GET", f"{b.prefix}/metrics", headers={"Accept": "text/plain"})
            resp = conn.getresponse()
            data = resp.read(MAX_METRICS_BYTES)
            if resp.will_close or len(data) >= MAX_METRICS_BYTES:
                conn.close()
        except ConnectionRefusedError as exc:
            conn.close()
            self._note_failure(b, f"metrics connect: {exc}")
            raise
        except Exception:
            conn.close()
            raise
        waiting = None
        if resp.status == 200:
            waiting = parse_queue_metric(data.decode("utf-8", "replace"))
        with self._lock:
            b.sampled_waiting = waiting
            b.sample_ok_at = time.monotonic()
        self._note_success(b)


def _body_framing_safe(headers: List[Tuple[str, str]]) -> str:
    """Response framing kind; invalid framing is treated as close-delimited."""
    try:
        return _body_framing(headers)[0]
    except ValueError:
        return "none"


# --------------------------------------------------------------------------------------
# CLI


def write_port_file(path: str, port: int) -> None:
    """Write the port atomically: temp file in the same directory, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".port-", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{port}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _parse_listen(value: str) -> Tuple[str, int]:
    """Parse ``HOST:PORT`` (IPv6 as ``[::1]:PORT``)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def build_parser() -> argparse.ArgumentParser:
    """Build the ``proxy`` role's argument parser."""
    d = ProxyConfig(backends=[])
    p = argparse.ArgumentParser(
        prog="agent.pyz proxy", description="Endpoint proxy for one model alias."
    )
    p.add_argument("--listen", type=_parse_listen, default=("127.0.0.1", 0), metavar="HOST:PORT")
    p.add_argument(
        "--backend",
        action="append",
        required=True,
        metavar="URL",
        help="backend base URL, e.g. http://127.0.0.1:8001 (repeatable)",
    )
    p.add_argument("--port-file", metavar="PATH", help="write the bound port here atomically")
    p.add_argument(
        "--max-queued",
        type=int,
        default=None,
        metavar="N",
        help="per-backend queue limit; 429 when every backend is over it",
    )
    p.add_argument("--max-header-bytes", type=int, default=d.max_header_bytes)
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--header-timeout", type=float, default=d.header_timeout)
    p.add_argument("--idle-timeout", type=float, default=d.idle_timeout)
    p.add_argument("--max-connections", type=int, default=d.max_connections)
    p.add_argument("--connect-timeout", type=float, default=d.connect_timeout)
    p.add_argument("--read-timeout", type=float, default=d.read_timeout)
    p.add_argument("--metrics-interval", type=float, default=d.metrics_interval)
    return p


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    """Turn parsed CLI arguments into a ProxyConfig."""
    host, port = args.listen
    return ProxyConfig(
        backends=list(args.backend),
        host=host,
        port=port,
        max_queued=args.max_queued,
        max_header_bytes=args.max_header_bytes,
        max_body_bytes=args.max_body_bytes,
        header_timeout=args.header_timeout,
        idle_timeout=args.idle_timeout,
        max_connections=args.max_connections,
        connect_timeout=args.connect_timeout,
        read_timeout=args.read_timeout,
        metrics_interval=args.metrics_interval,
    )


def main(argv: List[str]) -> int:
    """Run the proxy until SIGTERM/SIGINT; return the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s proxy %(levelname)s %(message)s"
    )
    try:
        proxy = Proxy(config_from_args(args))
        port = proxy.start()
    except (ValueError, OSError) as exc:
        LOG.error("cannot start: %s", exc)
        return 1
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if args.port_file:
            write_port_file(args.port_file, port)
        while not stop.wait(1.0):
            pass
        LOG.info("signal received, stopping")
    except OSError as exc:
        LOG.error("cannot write port file %s: %s", args.port_file, exc)
        return 1
    finally:
        proxy.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
