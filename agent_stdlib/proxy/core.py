"""Event-loop side of the endpoint proxy: listener, attempts/failover, pools, sweeper.

All methods run on the proxy's single event loop thread (:mod:`agent_stdlib.proxy.loop`).
"""

from __future__ import annotations

import logging
import socket
from typing import Any, Dict, Optional, Set, Tuple

from .client import Client
from .config import ProxyConfig
from .exchange import Exchange
from .loop import READ, Connecting, Loop, Stream, Timer, set_nodelay
from .route import Backend, Router, Sampler, Stats, affinity_key
from .upstream import Upstream

LOG = logging.getLogger("synthbatch.proxy")
POOL_MAX = 256
ACCEPT_BURST = 64
ACCEPT_PAUSE_S = 1.0


class Core:
    """The proxy's runtime state and the request life cycle across backends."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.router = Router(config)
        self.stats = Stats()
        self.clients: Set[Client] = set()
        self.upstreams: Set[Upstream] = set()
        self.connecting: Set[Connecting] = set()
        self.stopping = False
        self.loop = Loop()
        self.listener: Optional[socket.socket] = None
        self.sampler: Optional[Sampler] = None
        self.sweep_timer: Optional[Timer] = None
        shortest = min(config.header_timeout, config.idle_timeout, config.pool_idle_timeout)
        self.sweep_interval = min(1.0, max(0.02, shortest / 4))
        self.next_reap = 0.0
        self.addrs: Dict[int, Tuple[int, Tuple[Any, ...]]] = {}

    # ---- lifecycle ------------------------------------------------------------------

    def open(self) -> int:
        """Bind the listener, schedule the sweeper, start the sampler; return the port."""
        host = self.config.host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, self.config.port))
            sock.listen(min(self.config.max_connections, 1024))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.listener = sock
        self.loop.add(sock.fileno(), READ, self._accept)
        self.sweep_timer = self.loop.call_later(self.sweep_interval, self.sweep)
        if self.config.max_queued is not None:
            self.sampler = Sampler(self.router, self.loop.call_threadsafe)
            self.sampler.start()
        return int(sock.getsockname()[1])

    def _accept(self, events: int) -> None:
        """Accept a burst of client connections."""
        listener = self.listener
        assert listener is not None
        for _ in range(ACCEPT_BURST):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: back off, keep serving
                LOG.warning("accept failed (%s); pausing accepts for %gs", exc, ACCEPT_PAUSE_S)
                self.loop.remove(listener.fileno())
                self.loop.call_later(ACCEPT_PAUSE_S, self._resume_accept)
                return
            sock.setblocking(False)
            set_nodelay(sock)
            client = Client(self)
            client.connection_made(Stream(self.loop, sock, client))

    def _resume_accept(self) -> None:
        if self.listener is not None and not self.stopping:
            self.loop.add(self.listener.fileno(), READ, self._accept)

    def close(self) -> None:
        """Stop listening and drop every connection (on the loop thread)."""
        self.stopping = True
        if self.listener is not None:
            self.loop.remove(self.listener.fileno())
            self.listener.close()
            self.listener = None
        if self.sweep_timer is not None:
            self.sweep_timer.cancel()
        if self.sampler is not None:
            self.sampler.stop()
        for pending in list(self.connecting):
            pending.cancel()
        self.connecting.clear()
        for client in list(self.clients):
            client.abort()
        for up in list(self.upstreams):
            up.transport.abort()  # type: ignore[union-attr]
        for b in self.router.backends:
            b.pool.clear()

    # ---- attempts and failover ------------------------------------------------------

    def attempt(self, ex: Exchange) -> None:
        """Send ``ex`` to the best untried backend, or give up.

        A first attempt that finds every healthy backend over its queue limit marks the
        exchange for the proxy's own 429 instead (answered once the body was read).
        """
        if ex.dead:
            return
        key = ex.affinity
        if key is None:
            value = ex.head.affinity
            key = ex.affinity = (affinity_key(value) or b"") if value else b""
        if key:
            b = self.router.pick_affine(key, ex.tried, self.loop.now, self.stats)
        else:
            b = self.router.pick(ex.tried, self.loop.now)
        if b is None:
            if ex.tried:
                self.give_up(ex)
            else:  # every healthy backend is over its queue limit: shed the request
                ex.local = "429"
            return
        if ex.tried:
            self.stats.retries_total += 1
        ex.tried |= 1 << b.index
        ex.backend = b
        pool = b.pool
        while pool:  # an idle pooled connection is the usual case
            up = pool.pop()
            if up.alive:
                up.attach(ex, reused=True)
                return
        self.connect(ex, b)

    def reconnect(self, ex: Exchange, b: Backend) -> None:
        """Retry ``ex`` on a new connection to the same backend (a pooled one went stale)."""
        self.connect(ex, b)

    def connect(self, ex: Exchange, b: Backend) -> None:
        """Open a new backend connection for ``ex`` (connect errors fail over)."""
        try:
            family, addr = self.address(b)
        except OSError as exc:
            self.loop.call_soon(self._connected, ex, b, None, None, exc)
            return

        def done(pending: Connecting, sock: Optional[socket.socket],
                 error: Optional[OSError]) -> None:
            self._connected(ex, b, pending, sock, error)

        timeout = self.config.connect_timeout
        self.connecting.add(Connecting(self.loop, addr, family, timeout, done))

    def address(self, b: Backend) -> Tuple[int, Tuple[Any, ...]]:
        """The backend's socket address, resolved once (OSError when it cannot be)."""
        found = self.addrs.get(b.index)
        if found is None:
            info = socket.getaddrinfo(b.host, b.port, type=socket.SOCK_STREAM)[0]
            found = self.addrs[b.index] = (info[0], info[4])
        return found

    def _connected(
        self,
        ex: Exchange,
        b: Backend,
        pending: Optional[Connecting],
        sock: Optional[socket.socket],
        error: Optional[OSError],
    ) -> None:
        """A backend connect finished: attach the exchange, or fail over."""
        if pending is not None:
            self.connecting.discard(pending)
        if sock is None:
            why = error.strerror if error is not None and error.strerror else str(error)
            self.router.note_failure(b, f"connect: {why}")
            if not ex.dead and ex.backend is b and ex.up is None:
                self.attempt_failed(ex, f"connect to {b.url} failed: {why}", retriable=True)
            return
        self.router.note_success(b)
        up = Upstream(self, b)
        up.connection_made(Stream(self.loop, sock, up))
        if ex.dead or ex.backend is not b or self.stopping:
            self.pool_put(up)
            return
        up.attach(ex, reused=False)

    def release(self, ex: Exchange) -> None:
        """Give back the in-flight slot of the current attempt."""
        b = ex.backend
        if b is not None:
            b.in_flight -= 1
            ex.backend = None

    def attempt_failed(self, ex: Exchange, message: str, retriable: bool) -> None:
        """An attempt ended without a usable response."""
        self.release(ex)
        ex.last_error = message
        if retriable:
            self.attempt(ex)
        else:
            ex.client.error(502, message)

    def give_up(self, ex: Exchange) -> None:
        """Every backend was tried: pass the last 429/503 through, else answer 502."""
        if ex.last_retry is None:
            ex.client.error(502, f"all backends failed: {ex.last_error}")
            return
        status, reason, head, body = ex.last_retry
        extra = b"\r\nContent-Length: %d" % len(body)
        ex.keep = ex.keep and ex.body_done
        if not ex.keep:
            extra += b"\r\nConnection: close"
        if status == 429:
            self.stats.passthrough_429_total += 1
        payload = b"" if ex.method == b"HEAD" else body
        ex.sent = True
        client = ex.client
        client.write(b"HTTP/1.1 %d %s%s%s\r\n\r\n%s" % (status, reason, head.block, extra, payload))
        client.response_done(ex)

    def abandon(self, ex: Exchange) -> None:
        """The client went away (or errored): drop the backend exchange too."""
        ex.dead = True
        up = ex.up
        if up is not None:
            ex.up = None
            up.ex = None
            up.transport.abort()  # type: ignore[union-attr]
        self.release(ex)

    # ---- pools and timeouts ---------------------------------------------------------

    def pool_put(self, up: Upstream) -> None:
        """Keep an idle backend connection for reuse (or close it)."""
        pool = up.backend.pool
        if self.stopping or not up.alive or len(pool) >= POOL_MAX:
            up.transport.close()  # type: ignore[union-attr]
            return
        up.idle_since = self.loop.now
        pool.append(up)

    def sweep(self) -> None:
        """Expire client deadlines; close pooled connections idle too long."""
        now = self.loop.now
        for client in [c for c in self.clients if now > c.deadline]:
            client.on_timeout(now)
        if now >= self.next_reap:
            idle = self.config.pool_idle_timeout
            self.next_reap = now + idle / 2
            for b in self.router.backends:
                stale = [up for up in b.pool if now - up.idle_since >= idle]
                for up in stale:
                    b.pool.remove(up)
                    up.transport.close()  # type: ignore[union-attr]
        self.sweep_timer = self.loop.call_later(self.sweep_interval, self.sweep)

    def count_error(self, status: int) -> None:
        """Count an error answer of the proxy itself."""
        errors = self.stats.errors_total
        errors[status] = errors.get(status, 0) + 1

    def metrics_text(self) -> str:
        """Render the proxy's own /metrics."""
        return self.router.metrics_text(self.stats, len(self.clients))
