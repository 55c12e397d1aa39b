"""Event-loop side of the endpoint proxy: listener, attempts/failover, pools, sweeper.

All methods run on the proxy's single event loop thread.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING, List, Optional, Set, Tuple

from agent_stdlib.proxy_client import Client, Exchange
from agent_stdlib.proxy_route import Backend, Router, Sampler, Stats
from agent_stdlib.proxy_upstream import Upstream

if TYPE_CHECKING:  # pragma: no cover
    from agent_stdlib.proxy import ProxyConfig

POOL_MAX = 256
RECV_SIZE = 65536


class Core:
    """The proxy's runtime state and the request life cycle across backends."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.router = Router(config)
        self.stats = Stats()
        self.clients: Set[Client] = set()
        self.upstreams: Set[Upstream] = set()
        self.tasks: Set[asyncio.Future] = set()
        self.stopping = False
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.server: Optional[asyncio.AbstractServer] = None
        self.sweep_handle: Optional[asyncio.TimerHandle] = None
        shortest = min(config.header_timeout, config.idle_timeout, config.pool_idle_timeout)
        self.sweep_interval = min(1.0, max(0.02, shortest / 4))
        self.next_reap = 0.0
        self.out: List[Tuple[asyncio.Transport, bytes]] = []
        # Loop-iteration clock for hot-path deadlines: refreshed by flush() (every busy
        # iteration) and sweep(), so it is never older than one sweep interval.
        self.now = time.monotonic()
        # asyncio's plain Protocol path calls recv(256 KiB) per read, which costs far more
        # than the read itself; BufferedProtocols read into this buffer instead.
        self.rbuf = memoryview(bytearray(RECV_SIZE))

    # ---- lifecycle ------------------------------------------------------------------

    async def open(self) -> int:
        """Bind the listener and start the sweeper (and sampler); return the port."""
        loop = self.loop = asyncio.get_running_loop()
        host = self.config.host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, self.config.port))
            sock.setblocking(False)
            backlog = min(self.config.max_connections, 1024)
            self.server = await loop.create_server(lambda: Client(self), sock=sock, backlog=backlog)
        except BaseException:
            sock.close()
            raise
        self.sweep_handle = loop.call_later(self.sweep_interval, self.sweep)
        if self.config.max_queued is not None:
            self._spawn(Sampler(self.router).run())
        return int(sock.getsockname()[1])

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        self.stopping = True
        if self.server is not None:
            self.server.close()
        if self.sweep_handle is not None:
            self.sweep_handle.cancel()
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        for client in list(self.clients):
            client.abort()
        for up in list(self.upstreams):
            up.transport.abort()  # type: ignore[union-attr]
        for b in self.router.backends:
            b.pool.clear()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        for _ in range(3):  # let connection_lost callbacks run
            await asyncio.sleep(0)

    def _spawn(self, coro: object) -> None:
        """Run a coroutine as a task owned by the core."""
        task = self.loop.create_task(coro)  # type: ignore[union-attr,arg-type]
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ---- attempts and failover ------------------------------------------------------

    def attempt(self, ex: Exchange) -> None:
        """Send ``ex`` to the best untried backend, or give up."""
        if ex.dead:
            return
        b = self.router.pick(ex.tried, self.now)
        if b is None:
            self.give_up(ex)
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
        self._spawn(self._connect(ex, b))

    def reconnect(self, ex: Exchange, b: Backend) -> None:
        """Retry ``ex`` on a new connection to the same backend (a pooled one went stale)."""
        self._spawn(self._connect(ex, b))

    async def _connect(self, ex: Exchange, b: Backend) -> None:
        """Open a new backend connection for ``ex`` (connect errors fail over)."""
        loop = self.loop
        assert loop is not None
        try:
            _, up = await asyncio.wait_for(
                loop.create_connection(lambda: Upstream(self, b), b.host, b.port),
                self.config.connect_timeout,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            self.router.note_failure(b, f"connect: {exc or type(exc).__name__}")
            if not ex.dead and ex.backend is b and ex.up is None:
                self.attempt_failed(ex, f"connect to {b.url} failed: {exc}", retriable=True)
            return
        self.router.note_success(b)
        if ex.dead or ex.backend is not b or self.stopping:
            self.pool_put(up)  # type: ignore[arg-type]
            return
        up.attach(ex, reused=False)  # type: ignore[attr-defined]

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

    # ---- batched writes -------------------------------------------------------------

    def send(self, transport: asyncio.Transport, data: bytes) -> None:
        """Queue a write; all queued writes go out together once the ready callbacks of this
        loop iteration have run (peers get woken once per burst instead of once per send)."""
        if not self.out:
            self.loop.call_soon(self.flush)  # type: ignore[union-attr]
        self.out.append((transport, data))

    def flush(self) -> None:
        """Write out queued data (also called before closing a transport)."""
        self.now = time.monotonic()
        out = self.out
        if out:
            self.out = []
            for transport, data in out:
                if not transport.is_closing():
                    transport.write(data)

    # ---- pools and timeouts ---------------------------------------------------------

    def pool_put(self, up: Upstream) -> None:
        """Keep an idle backend connection for reuse (or close it)."""
        pool = up.backend.pool
        if self.stopping or not up.alive or len(pool) >= POOL_MAX:
            up.transport.close()  # type: ignore[union-attr]
            return
        up.idle_since = self.now
        pool.append(up)

    def sweep(self) -> None:
        """Expire client deadlines; close pooled connections idle too long."""
        now = self.now = time.monotonic()
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
        self.sweep_handle = self.loop.call_later(self.sweep_interval, self.sweep)  # type: ignore[union-attr]

    def count_error(self, status: int) -> None:
        """Count an error answer of the proxy itself."""
        errors = self.stats.errors_total
        errors[status] = errors.get(status, 0) + 1

    def metrics_text(self) -> str:
        """Render the proxy's own /metrics."""
        return self.router.metrics_text(self.stats, len(self.clients))
