"""One proxied request, and what the proxy's connections may do to each other.

The core (:mod:`agent_stdlib.proxy.core`) owns every connection. A client connection
(:mod:`~agent_stdlib.proxy.client`) and a backend connection
(:mod:`~agent_stdlib.proxy.upstream`) meet only in an :class:`Exchange` and call back into
the core. The three Protocols below name exactly what they call, so that neither module
imports the core or the other one: imports run one way, from ``main`` and ``core`` at the
top through ``client``/``upstream`` and this module down to ``route``, ``http``, ``loop``
and ``config``.
"""

from __future__ import annotations

from typing import Any, List, Optional, Set

from .config import ProxyConfig
from .http import ChunkScanner, Head
from .loop import Loop, Stream
from .route import Backend, Router, Stats

try:
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8 is not supported anyway
    Protocol = object  # type: ignore[assignment,misc]


class Hub(Protocol):
    """The core as a connection sees it (implemented by ``core.Core``)."""

    config: ProxyConfig
    stats: Stats
    router: Router
    loop: Loop
    clients: Set[Any]
    upstreams: Set[Any]
    stopping: bool

    def attempt(self, ex: Exchange) -> None:
        """Send ``ex`` to the best untried backend, or give up."""

    def reconnect(self, ex: Exchange, b: Backend) -> None:
        """Retry ``ex`` on a new connection to the same backend."""

    def release(self, ex: Exchange) -> None:
        """Give back the in-flight slot of the current attempt."""

    def attempt_failed(self, ex: Exchange, message: str, retriable: bool) -> None:
        """An attempt ended without a usable response."""

    def abandon(self, ex: Exchange) -> None:
        """The client went away: drop the backend exchange too."""

    def pool_put(self, up: Any) -> None:
        """Keep an idle backend connection for reuse (or close it)."""

    def count_error(self, status: int) -> None:
        """Count an error answer of the proxy itself."""

    def metrics_text(self) -> str:
        """Render the proxy's own /metrics."""


class ClientSide(Protocol):
    """What a backend connection and the core do to the client of an exchange."""

    transport: Optional[Stream]
    deadline: float
    write_paused: bool

    def write(self, data: bytes) -> None:
        """Write response bytes to the client."""

    def response_done(self, ex: Exchange) -> None:
        """The response of ``ex`` has been written completely."""

    def error(self, status: int, message: str, retry_after: str = "") -> None:
        """Answer the client with an error of the proxy itself."""

    def abort(self) -> None:
        """Close the client connection at once."""

    def upstream_full(self, on: bool) -> None:
        """The backend's buffer is full (on) or drained (off): flow control."""


class UpstreamSide(Protocol):
    """What a client connection does to the backend connection of its exchange."""

    transport: Optional[Stream]

    def pause_reading(self, on: bool) -> None:
        """Stop (on) or resume (off) reading the backend's response."""


class Exchange:
    """One client request while it is proxied (possibly to several backends in turn)."""

    # Defaults live on the class: a request sets only what differs (this is the hot path).
    local = ""  # "health", "metrics" or "429": answered by the proxy itself
    body_done = False
    remaining = 0
    scanner: Optional[ChunkScanner] = None
    tried = 0  # bit set of backend indexes already tried
    affinity: Optional[bytes] = None  # the affinity header's value (b"": none), once read
    backend: Optional[Backend] = None  # the current attempt's backend (holds an in-flight slot)
    up: Optional[UpstreamSide] = None
    sent = False  # any byte of the final response written to the client
    last_retry: Optional[tuple] = None  # (status, reason, head, body) of a 429/503
    last_error = "no backend available"
    dead = False
    started = 0.0  # loop time the request head arrived
    forwarded = 0.0  # loop time its last attempt was sent to a backend (0: never)

    def __init__(self, client: ClientSide, method: bytes, target: bytes, http10: bool,
                 head: Head) -> None:
        self.client = client
        self.method = method
        self.target = target
        self.http10 = http10
        tokens = head.conn_tokens
        if tokens:
            self.keep = b"keep-alive" in tokens if http10 else b"close" not in tokens
        else:
            self.keep = not http10
        self.head = head
        self.parts: List[bytes] = []  # request body as sent on the wire (replayed on failover)

    def upstream_head(self, b: Backend) -> bytes:
        """The request head for backend ``b``, followed by the body received so far."""
        head = self.head
        body = b"".join(self.parts) if len(self.parts) != 1 else self.parts[0]
        if head.framing == "length":
            return b"%s %s%s HTTP/1.1%s%s\r\nContent-Length: %d\r\n\r\n%s" % (
                self.method, b.prefix_b, self.target, b.host_line, head.block, head.length, body
            )
        framing = b"\r\nTransfer-Encoding: chunked" if head.framing == "chunked" else b""
        return b"%s %s%s HTTP/1.1%s%s%s\r\n\r\n%s" % (
            self.method, b.prefix_b, self.target, b.host_line, head.block, framing, body
        )
