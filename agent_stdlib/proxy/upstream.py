"""Backend side of the endpoint proxy: one protocol object per backend connection.

A connection serves one exchange at a time and goes back to its backend's idle pool when
the response was read completely. Response bodies are passed to the client as they
arrive: Content-Length and chunked bodies verbatim (chunked is scanned only to find its
end), close-delimited bodies re-framed as chunks. 429/503 answers are held back (small,
bounded) so that the request can fail over to another backend.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, List, Optional

from .exchange import Exchange, Hub
from .http import (
    STATUS_LINES,
    ChunkScanner,
    Head,
    chunk,
    parse_head,
    parse_status_line,
)
from .route import Backend

if TYPE_CHECKING:  # pragma: no cover
    from .loop import Stream

RETRIABLE_STATUS = (429, 503)
MAX_ERROR_BODY = 65536
_HEAD, _BODY = 0, 1


class Upstream:
    """One kept-alive connection to a backend."""

    def __init__(self, core: Hub, backend: Backend) -> None:
        self.core = core
        self.backend = backend
        self.transport: Optional[Stream] = None
        self.ex: Optional[Exchange] = None
        self.alive = True
        self.reused = False
        self.got = False  # any response byte for the current exchange
        self.state = _HEAD
        self.buf = b""
        self.framing = ""
        self.remaining = 0
        self.scanner: Optional[ChunkScanner] = None
        self.keep = False
        self.buffering = False  # holding back a 429/503 answer
        self.held: List[bytes] = []
        self.held_size = 0
        self.retry_head: Optional[tuple] = None
        self.pending = b""  # client response head not yet written (merged with the body)
        self.wrap = False  # close-delimited body re-framed as chunks for the client
        self.idle_since = 0.0
        self.read_paused = False

    # ---- lifecycle ------------------------------------------------------------------

    def connection_made(self, transport: Stream) -> None:
        """The connection to the backend is open."""
        self.transport = transport
        self.core.upstreams.add(self)

    def attach(self, ex: Exchange, reused: bool) -> None:
        """Start sending ``ex`` on this connection."""
        self.ex = ex
        ex.up = self
        ex.forwarded = self.core.loop.now
        self.reused = reused
        self.got = False
        self.state = _HEAD
        self.buf = b""
        self.buffering = False
        if ex.client.write_paused:
            self.pause_reading(True)
        self.transport.write(ex.upstream_head(self.backend))  # type: ignore[union-attr]

    def pause_reading(self, on: bool) -> None:
        """Stop/restart reading from the backend (the client is slow to take the data)."""
        if on == self.read_paused or not self.alive:
            return
        self.read_paused = on
        if on:
            self.transport.pause_reading()  # type: ignore[union-attr]
        else:
            self.transport.resume_reading()  # type: ignore[union-attr]

    def pause_writing(self) -> None:  # noqa: D102
        if self.ex is not None:
            self.ex.client.upstream_full(True)

    def resume_writing(self) -> None:  # noqa: D102
        if self.ex is not None:
            self.ex.client.upstream_full(False)

    def eof_received(self) -> bool:  # noqa: D102
        return False

    def connection_lost(self, exc: Optional[Exception]) -> None:  # noqa: D102
        self.alive = False
        core = self.core
        core.upstreams.discard(self)
        ex = self.ex
        if ex is None:
            pool = self.backend.pool
            if self in pool:
                pool.remove(self)
            return
        self.ex = None
        ex.up = None
        if self.state == _HEAD:
            if not self.got and self.reused:
                core.reconnect(ex, self.backend)  # stale pooled connection: not a failover
                return
            why = "closed the connection" if not self.got else "sent an incomplete head"
            core.attempt_failed(
                ex, f"{self.backend.url} {why}", retriable=not self.got and not ex.body_done
            )
        elif self.buffering or (self.framing == "eof" and exc is None):
            self.keep = False
            self._done(ex)
        else:
            core.release(ex)
            ex.client.abort()

    # ---- reading the response -------------------------------------------------------

    def data_received(self, data: bytes) -> None:  # noqa: D102
        ex = self.ex
        if ex is None:  # nothing asked: a stray byte means the connection is unusable
            self.transport.close()  # type: ignore[union-attr]
            return
        self.got = True
        if self.state == _HEAD:
            buf = self.buf + data if self.buf else data
            while True:
                idx = buf.find(b"\r\n\r\n")
                if idx < 0:
                    if len(buf) > self.core.config.max_header_bytes:
                        self._bad(ex, "response head too large")
                    else:
                        self.buf = buf
                    return
                try:
                    head = parse_head(buf[:idx])
                    start = head.start
                    status, version, reason = (
                        STATUS_LINES.get(start) or parse_status_line(start)
                    )
                except ValueError as exc:
                    self._bad(ex, f"bad response from backend: {exc}")
                    return
                buf = buf[idx + 4 :]
                if status >= 200 or status == 101:
                    break
            self.buf = b""
            if not self._head(ex, status, version, reason, head):
                return
            data = buf  # possibly empty: _body writes the head, or ends a zero-length body
        self._body(ex, data)

    def _bad(self, ex: Exchange, message: str) -> None:
        """The backend sent garbage before a usable head: 502, drop the connection."""
        self.ex = None
        ex.up = None
        self.transport.abort()  # type: ignore[union-attr]
        self.core.attempt_failed(ex, message, retriable=False)

    def _head(self, ex: Exchange, status: int, version: bytes, reason: bytes, head: Head) -> bool:
        """Set up framing for a response head; False when the exchange ended here."""
        if status == 101:
            self._bad(ex, "protocol upgrades are not supported")
            return False
        self.state = _BODY
        no_body = ex.method == b"HEAD" or status in (204, 304)
        self.keep = version == b"HTTP/1.1" and b"close" not in head.conn_tokens
        decl = head.framing
        self.wrap = False
        if no_body:
            self.framing = "none"
        elif decl == "length":
            self.framing, self.remaining = "length", head.length
        elif decl == "chunked":
            self.framing = "chunked"
            self.scanner = ChunkScanner(decode=ex.http10 or status in RETRIABLE_STATUS)
        else:
            self.framing, self.keep = "eof", False
        if head.bad_framing:
            self.keep = False
        if status in RETRIABLE_STATUS:
            self.buffering = True
            self.held = []
            self.held_size = 0
            self.retry_head = (status, reason, head)
            return True
        keep = ex.keep
        if decl == "length":
            extra = b"\r\nContent-Length: %d" % head.length
        elif not no_body and not ex.http10:
            extra = b"\r\nTransfer-Encoding: chunked"
            self.wrap = self.framing == "eof"
        else:
            extra = b""
            keep = keep and no_body
        if not keep:
            extra += b"\r\nConnection: close"
        elif ex.http10:
            extra += b"\r\nConnection: keep-alive"
        ex.keep = keep
        if status == 429:
            self.core.stats.passthrough_429_total += 1
        ex.sent = True
        self.pending = b"HTTP/1.1 %d %s%s%s\r\n\r\n" % (status, reason, head.block, extra)
        return True

    def _body(self, ex: Exchange, data: bytes) -> None:
        """Pass (or hold) response body bytes; finish the exchange at the end."""
        framing = self.framing
        done = False
        if framing == "length":
            n = self.remaining
            if len(data) >= n:
                if len(data) > n:
                    data, self.keep = data[:n], False
                done = True
            self.remaining = n - len(data)
        elif framing == "chunked":
            scanner = self.scanner
            assert scanner is not None
            try:
                used = scanner.feed(data)
            except ValueError:
                self.keep = False
                self.transport.abort()  # type: ignore[union-attr]
                return
            if used < len(data):
                data, self.keep = data[:used], False
            if scanner.decode:
                data = b"".join(scanner.out)
                scanner.out.clear()
            done = scanner.done
        elif framing == "eof":
            if self.wrap and data:
                data = chunk(data)
        else:
            done = True
            if data:
                self.keep = False
        if self.buffering:
            self.held.append(data)
            self.held_size += len(data)
            if self.held_size > MAX_ERROR_BODY:
                self.keep, done = False, True
        elif done:
            self.pending += data  # written by _done together with the head, if still pending
        else:
            self._flush(ex, data)
        if done:
            self._done(ex)

    def _flush(self, ex: Exchange, data: bytes) -> None:
        """Write body bytes (after the pending head, in one write) to the client."""
        if self.pending:
            data, self.pending = self.pending + data, b""
        if data:
            client = ex.client
            client.write(data)
            client.deadline = time.monotonic() + self.core.config.read_timeout

    def _done(self, ex: Exchange) -> None:
        """The response was read completely (or ended by EOF where that is legal)."""
        self.ex = None
        ex.up = None
        core = self.core
        if self.read_paused:
            self.pause_reading(False)
        if self.keep and ex.body_done and self.alive:
            core.pool_put(self)
        elif self.alive:
            self.transport.close()  # type: ignore[union-attr]
        if not self.buffering:
            data = self.pending + b"0\r\n\r\n" if self.wrap else self.pending
            if data:
                self.pending = b""
                core.stats.bytes_out += len(data)
                ex.client.transport.write(data)  # type: ignore[union-attr]
            b = ex.backend
            if b is not None:
                b.in_flight -= 1
                ex.backend = None
            ex.client.response_done(ex)
            return
        self.buffering = False  # a held-back 429/503: try the next backend
        body = b"".join(self.held)[:MAX_ERROR_BODY]
        self.held = []
        status, reason, head = self.retry_head  # type: ignore[misc]
        ex.last_retry = (status, reason, head, body)
        ex.last_error = f"{self.backend.url} answered {status}"
        core.release(ex)
        core.attempt(ex)
