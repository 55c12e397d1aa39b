"""Client side of the endpoint proxy: one protocol object per client connection.

The protocol parses request heads straight from ``data_received`` (no stream reader), reads
the request body (Content-Length or chunked, forwarded as it arrives and recorded for a
possible failover), hands the request to the core (a :class:`~agent_stdlib.proxy.exchange.Hub`) and
writes whatever the upstream side produces. One request is in flight per connection;
pipelined requests wait in the buffer.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Optional

from .exchange import Exchange, Hub
from .http import (
    REQUEST_LINES,
    ChunkScanner,
    HttpError,
    error_response,
    parse_head,
    parse_request_line,
    simple_response,
)

if TYPE_CHECKING:  # pragma: no cover
    from .loop import Stream

HEAD, BODY, WAIT, LINGER, CLOSED = range(5)
LINGER_SECONDS = 1.0
LINGER_MAX_BYTES = 1024 * 1024
PIPELINE_MAX_BYTES = 256 * 1024
PAUSE_UPSTREAM, PAUSE_PIPELINE = 1, 2
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Client:
    """One client connection (HTTP/1.1 keep-alive, one request in flight at a time)."""

    def __init__(self, core: Hub) -> None:
        self.core = core
        self.transport: Optional[Stream] = None
        self.buf = b""
        self.state = HEAD
        self.deadline = 0.0
        self.head_started = False
        self.ex: Optional[Exchange] = None
        self.paused = 0
        self.write_paused = False
        self.processing = False
        self.lingered = 0

    # ---- transport callbacks --------------------------------------------------------

    def connection_made(self, transport: Stream) -> None:
        """A client connected (the listener accepted it)."""
        self.transport = transport
        core = self.core
        if core.stopping or len(core.clients) >= core.config.max_connections:
            self.state = CLOSED
            transport.write(error_response(503, "too many client connections", True, "1"))
            transport.close()
            return
        core.clients.add(self)
        self.deadline = time.monotonic() + core.config.header_timeout

    def data_received(self, data: bytes) -> None:  # noqa: D102
        self.core.stats.bytes_in += len(data)
        state = self.state
        if state == HEAD:
            self.buf = self.buf + data if self.buf else data
            self._process()
        elif state == BODY:
            self._body(data)
        elif state == WAIT:
            self.buf += data
            if len(self.buf) > PIPELINE_MAX_BYTES:
                self._pause(PAUSE_PIPELINE, True)
        elif state == LINGER:
            self.lingered += len(data)
            if self.lingered > LINGER_MAX_BYTES:
                self.transport.close()  # type: ignore[union-attr]

    def eof_received(self) -> bool:  # noqa: D102
        return False  # a client that half-closes is treated as gone (closes the transport)

    def connection_lost(self, exc: Optional[Exception]) -> None:  # noqa: D102
        self.state = CLOSED
        self.core.clients.discard(self)
        ex = self.ex
        if ex is not None:
            self.ex = None
            self.core.abandon(ex)

    def pause_writing(self) -> None:  # noqa: D102
        self.write_paused = True
        ex = self.ex
        if ex is not None and ex.up is not None:
            ex.up.pause_reading(True)

    def resume_writing(self) -> None:  # noqa: D102
        self.write_paused = False
        ex = self.ex
        if ex is not None and ex.up is not None:
            ex.up.pause_reading(False)

    # ---- reading requests -----------------------------------------------------------

    def _process(self) -> None:
        """Parse and start requests from the buffer while the connection is idle."""
        if self.processing:
            return
        self.processing = True
        limit = self.core.config.max_header_bytes
        try:
            while self.state == HEAD and self.buf:
                buf = self.buf
                if buf[:2] == b"\r\n":
                    self.buf = buf = buf.lstrip(b"\r\n")
                    continue
                idx = buf.find(b"\r\n\r\n")
                if idx < 0 or idx + 4 > limit:
                    if len(buf) > limit or idx >= 0:
                        self.error(431, "request header fields too large")
                    elif not self.head_started:
                        self.head_started = True
                        self.deadline = time.monotonic() + self.core.config.header_timeout
                    return
                self.buf = buf[idx + 4 :]
                self.head_started = False
                self._request(buf[:idx])
        finally:
            self.processing = False

    def _request(self, block: bytes) -> None:
        """Start one request from its head block."""
        core = self.core
        core.stats.requests_total += 1
        try:
            head = parse_head(block)
            start = head.start
            method, target, version = REQUEST_LINES.get(start) or parse_request_line(start)
            if head.bad_framing:
                raise HttpError(400, f"bad request: {head.bad_framing}")
        except HttpError as exc:
            self.error(exc.status, exc.message)
            return
        except ValueError as exc:
            self.error(400, f"bad request: {exc}")
            return
        ex = Exchange(self, method, target, version == b"HTTP/1.0", head)
        ex.started = core.loop.now
        self.ex = ex
        path = target.split(b"?", 1)[0] if method in (b"GET", b"HEAD") else b""
        if path in (b"/health", b"/metrics"):
            ex.local = path[1:].decode()
        if head.framing == "length":
            length = head.length
            if length > core.config.max_body_bytes:
                self.error(413, f"request body exceeds {core.config.max_body_bytes} bytes")
                return
            buf = self.buf
            if len(buf) >= length:  # the usual case: the whole body came with the head
                if length and not ex.local:
                    ex.parts.append(buf[:length] if len(buf) > length else buf)
                self.buf = buf[length:] if len(buf) > length else b""
                ex.body_done = True
            else:
                ex.remaining = length
        elif head.framing == "chunked":
            ex.scanner = ChunkScanner()
        else:
            ex.body_done = True
        if ex.body_done:
            self.state = WAIT
            self.deadline = core.loop.now + core.config.read_timeout
        else:
            self.state = BODY
            self.deadline = time.monotonic() + core.config.header_timeout
            data, self.buf = self.buf, b""
            if data:
                self._body(data)
            if self.ex is not ex:
                return
            if not ex.body_done and head.expect:
                self.write(CONTINUE)
        if not ex.local:
            core.attempt(ex)  # may shed it (ex.local = "429") when every backend is too busy
        if ex.local and ex.body_done and self.ex is ex:
            self._answer_local(ex)

    def _body(self, data: bytes) -> None:
        """Consume request body bytes (the rest is kept as pipelined data)."""
        ex = self.ex
        assert ex is not None
        rest = b""
        scanner = ex.scanner
        if scanner is None:
            n = ex.remaining
            if len(data) > n:
                data, rest = data[:n], data[n:]
            ex.remaining = n - len(data)
            done = not ex.remaining
        else:
            try:
                used = scanner.feed(data)
            except ValueError as exc:
                self.error(400, f"bad chunked body: {exc}")
                return
            if used < len(data):
                data, rest = data[:used], data[used:]
            if scanner.size > self.core.config.max_body_bytes:
                self.error(413, f"request body exceeds {self.core.config.max_body_bytes} bytes")
                return
            done = scanner.done
        if not ex.local:
            ex.parts.append(data)
            up = ex.up
            if up is not None:
                up.transport.write(data)  # type: ignore[union-attr]
        self.deadline = time.monotonic() + self.core.config.header_timeout
        if done:
            ex.body_done = True
            self.buf = rest
            if self.state == BODY:
                self.state = WAIT
                self.deadline = time.monotonic() + self.core.config.read_timeout
                if ex.local:
                    self._answer_local(ex)

    # ---- writing responses ----------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Write bytes to the client."""
        self.core.stats.bytes_out += len(data)
        self.transport.write(data)  # type: ignore[union-attr]

    def _answer_local(self, ex: Exchange) -> None:
        """Answer /health, /metrics or the backpressure 429 from the proxy itself."""
        core = self.core
        close = not ex.keep
        head_only = ex.method == b"HEAD"
        if ex.local == "health":
            doc = core.router.health()
            status = 200 if doc["status"] == "ok" else 503
            payload = json.dumps(doc).encode()
            data = simple_response(status, "application/json", payload, close, None, head_only)
        elif ex.local == "metrics":
            payload = core.metrics_text().encode()
            ctype = "text/plain; version=0.0.4"
            data = simple_response(200, ctype, payload, close, None, head_only)
        else:
            core.stats.rejected_429_total += 1
            core.count_error(429)
            data = error_response(429, "all backends are over their queue limit", close, "1")
        self.write(data)
        self.response_done(ex)

    def response_done(self, ex: Exchange) -> None:
        """The response of ``ex`` was written completely: next request, or close."""
        if self.ex is not ex:
            return
        self.ex = None
        if ex.forwarded:  # proxied: before forwarding (queue) and at the backend
            stats = self.core.stats
            stats.queue_s_total += ex.forwarded - ex.started
            stats.upstream_s_total += self.core.loop.now - ex.forwarded
            stats.timed_total += 1
        if not (ex.keep and ex.body_done) or self.state == CLOSED:
            self.linger()
            return
        self.state = HEAD
        self.deadline = self.core.loop.now + self.core.config.idle_timeout
        if self.paused:
            self._pause(PAUSE_PIPELINE | PAUSE_UPSTREAM, False)
        if self.buf:
            self._process()

    def error(self, status: int, message: str, retry_after: str = "") -> None:
        """Answer an error (if nothing of the response was sent yet) and close."""
        self.core.count_error(status)
        ex = self.ex
        if ex is not None:
            self.ex = None
            self.core.abandon(ex)
            if ex.sent:
                self.abort()
                return
        if self.state != CLOSED:
            self.write(error_response(status, message, True, retry_after))
        self.linger()

    def abort(self) -> None:
        """Drop the connection at once (e.g. a response stream broke midway)."""
        self.state = CLOSED
        self.transport.abort()  # type: ignore[union-attr]

    def linger(self) -> None:
        """Close after sending: half-close, then drain what the client still sends.

        Closing with unread input would send an RST that can destroy an answer the client
        has not read yet.
        """
        if self.state in (LINGER, CLOSED):
            return
        self.state = LINGER
        self.buf = b""
        self.deadline = time.monotonic() + LINGER_SECONDS
        if self.paused:
            self._pause(PAUSE_PIPELINE | PAUSE_UPSTREAM, False)
        transport = self.transport
        assert transport is not None
        transport.write_eof()  # after the buffered answer bytes

    def _pause(self, reason: int, on: bool) -> None:
        """Pause/resume reading from the client for a reason (flag bits)."""
        before = self.paused
        self.paused = before | reason if on else before & ~reason
        if self.transport is None or self.state == CLOSED:
            return
        if self.paused and not before:
            self.transport.pause_reading()
        elif before and not self.paused:
            self.transport.resume_reading()

    def upstream_full(self, on: bool) -> None:
        """The backend cannot take more request body right now (or can again)."""
        self._pause(PAUSE_UPSTREAM, on)

    def on_timeout(self, now: float) -> None:
        """The connection's deadline passed (called by the core's sweeper)."""
        state = self.state
        if state == HEAD:
            if self.buf:
                self.error(408, "timed out reading the request head")
            else:
                self.state = CLOSED
                self.transport.close()  # type: ignore[union-attr]
        elif state == BODY:
            self.error(408, "timed out reading the request body")
        elif state == WAIT:
            self.error(504, "timed out waiting for the backend")
        elif state == LINGER:
            self.state = CLOSED
            self.transport.close()  # type: ignore[union-attr]
