"""Backends, routing, passive health, queue sampling and counters of the endpoint proxy.

Everything here runs on the proxy's event loop thread except the sampler threads (which
only store samples and post health notes to the loop); ``health()`` and
``metrics_text()`` may also be called from other threads (they only read plain attributes).
"""

from __future__ import annotations

import http.client
import logging
import math
import re
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from .config import ProxyConfig, parse_backend_url
from .http import parse_prefix_cache, parse_queue_metric

LOG = logging.getLogger("synthbatch.proxy")
MAX_METRICS_BYTES = 8 * 1024 * 1024

OVER_LIMIT = 1 << 48  # added to the sort key of a backend over its queue limit
# Affinity (consistent hashing with bounded loads): a key's home is the first backend of
# its rendezvous order that is up and untried; it keeps the key while its in-flight count
# stays within LOAD_BOUND x the mean over healthy backends (counting the new request).
LOAD_BOUND = 1.5  # measured against 1.25: docs/performance.md
AFFINITY_MEMO = 65536  # keys whose rendezvous order is kept (emptied when full)
_KEY = re.compile(rb"[\x21-\x7e]{1,128}")


def affinity_key(value: bytes) -> Optional[bytes]:
    """The affinity header's value as a key (parse_head takes it out of the head); None
    when absent or not 1-128 visible ASCII characters."""
    return value if value and _KEY.fullmatch(value) else None


def rendezvous(key: bytes, n: int) -> List[int]:
    """Backend indexes in ``key``'s preference order (highest random weight first): the
    same for every proxy, and removing a backend moves only the keys it held."""
    return sorted(range(n), key=lambda i: zlib.crc32(b"%d\0%s" % (i, key)), reverse=True)


class Backend:
    """State of one backend replica."""

    def __init__(self, url: str, index: int) -> None:
        self.url = url.rstrip("/")
        self.index = index
        self.host, self.port, self.prefix = parse_backend_url(url)
        self.prefix_b = self.prefix.encode("latin-1")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_line = f"\r\nHost: {host}:{self.port}".encode("latin-1")
        self.in_flight = 0
        self.requests = 0
        self.failures: Deque[float] = deque()
        self.down_until = 0.0
        self.marked_down = False
        self.sample_ok_at = 0.0
        self.sampled_waiting: Optional[float] = None
        self.prefix_cache: Optional[Tuple[float, float]] = None  # (queries, hits) sampled
        self.pool: List[Any] = []  # idle upstream connections, most recently used last


@dataclass
class Stats:
    """Proxy-wide counters for the own /metrics endpoint."""

    requests_total: int = 0
    retries_total: int = 0
    rejected_429_total: int = 0
    passthrough_429_total: int = 0
    errors_total: Dict[int, int] = field(default_factory=dict)
    bytes_in: int = 0
    bytes_out: int = 0
    affinity_hits_total: int = 0  # keyed requests sent to their key's home
    affinity_fallbacks_total: int = 0  # keyed requests whose home was over the load bound
    # answered proxied requests (timed_total): seconds from arrival to the last attempt's
    # forwarding (queue_s_total), and from then to the whole response (upstream_s_total)
    timed_total: int = 0
    queue_s_total: float = 0.0
    upstream_s_total: float = 0.0


class Router:
    """Least outstanding requests with round-robin ties, passive health, queue limits."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.backends = [Backend(url, i) for i, url in enumerate(config.backends)]
        self.max_queued = config.max_queued
        self.stale_after = max(1.0, 10 * config.metrics_interval)
        self.rr = 0
        self.orders: Dict[bytes, List[int]] = {}  # memo of rendezvous()

    # ---- queue limits ---------------------------------------------------------------

    def queued(self, b: Backend, now: float) -> Optional[float]:
        """Queue length used for backpressure; None when unknown (fail open)."""
        if self.max_queued is None:
            return float(b.in_flight)
        if now - b.sample_ok_at > self.stale_after:
            return None
        if b.sampled_waiting is not None:
            return b.sampled_waiting
        return float(b.in_flight)

    # ---- picking --------------------------------------------------------------------

    def pick(self, tried: int, now: float) -> Optional[Backend]:
        """Choose an untried backend (``tried`` is a bit set of indexes).

        Fewest outstanding requests wins, ties go round-robin; backends over the queue
        limit come last; backends marked down are used only when all are down. The
        chosen backend's in-flight count is incremented. Returns None when every backend
        was tried, and on a first attempt (``tried == 0``) when every healthy backend is
        over its queue limit: the caller sheds that request with 429.
        """
        backends = self.backends
        n = len(backends)
        start = self.rr
        limit = self.max_queued
        stale_after = self.stale_after
        best: Optional[Backend] = None  # the best healthy backend
        spare: Optional[Backend] = None  # the best marked-down one (used when all are down)
        best_key = spare_key = 0
        healthy = False
        for b in backends:  # one pass; the key orders by in-flight count, then round-robin
            up = now >= b.down_until
            healthy = healthy or up
            if tried >> b.index & 1:
                continue
            in_flight = b.in_flight
            key = in_flight * n + (b.index - start) % n
            if limit is not None and now - b.sample_ok_at <= stale_after:  # inlined over()
                queued = b.sampled_waiting
                if (in_flight if queued is None else queued) > limit:
                    key += OVER_LIMIT  # after every backend under the limit
            if up:
                if best is None or key < best_key:
                    best, best_key = b, key
            elif spare is None or key < spare_key:
                spare, spare_key = b, key
        if not healthy:
            best = spare
        elif best is not None and best_key >= OVER_LIMIT and not tried:
            return None  # every healthy backend is over its queue limit
        if best is not None:
            self.rr = (best.index + 1) % n
            best.in_flight += 1
            best.requests += 1
        return best

    def pick_affine(self, key: bytes, tried: int, now: float, stats: Stats) -> Optional[Backend]:
        """Choose a backend for a request with affinity ``key``: the key's home (see
        LOAD_BOUND) when it is within the bound and under its queue limit, else
        :meth:`pick` (least outstanding requests), counted as a load-bound fallback."""
        backends = self.backends
        order = self.orders.get(key)
        if order is None:
            if len(self.orders) >= AFFINITY_MEMO:
                self.orders.clear()
            order = self.orders[key] = rendezvous(key, len(backends))
        home: Optional[Backend] = None
        for i in order:
            b = backends[i]
            if not tried >> i & 1 and now >= b.down_until:
                home = b
                break
        if home is not None:
            up = [b for b in backends if now >= b.down_until]
            bound = math.ceil(LOAD_BOUND * (sum(b.in_flight for b in up) + 1) / len(up))
            queued = self.queued(home, now) if self.max_queued is not None else None
            if home.in_flight + 1 <= bound and (queued is None or queued <= self.max_queued):
                stats.affinity_hits_total += 1
                home.in_flight += 1
                home.requests += 1
                return home
        stats.affinity_fallbacks_total += 1
        return self.pick(tried, now)

    # ---- passive health -------------------------------------------------------------

    def note_failure(self, b: Backend, why: str) -> None:
        """Record a connect failure; mark the backend down after too many in the window."""
        now = time.monotonic()
        b.failures.append(now)
        while b.failures and now - b.failures[0] > self.config.fail_window:
            b.failures.popleft()
        if len(b.failures) < self.config.fail_threshold or now < b.down_until:
            return
        b.down_until = now + self.config.down_seconds
        b.failures.clear()
        if not b.marked_down:
            b.marked_down = True
            LOG.warning("backend %s marked down (%s)", b.url, why)

    def note_success(self, b: Backend) -> None:
        """Record a successful connect; log when a backend comes back up."""
        if b.failures:
            b.failures.clear()
        b.down_until = 0.0
        if b.marked_down:
            b.marked_down = False
            LOG.info("backend %s marked up", b.url)

    # ---- reports --------------------------------------------------------------------

    def health(self) -> Dict[str, object]:
        """Return the health document served at ``GET /health``."""
        now = time.monotonic()
        rows = [
            {
                "url": b.url,
                "healthy": now >= b.down_until,
                "in_flight": b.in_flight,
                "requests": b.requests,
                "queued": self.queued(b, now),
            }
            for b in self.backends
        ]
        ok = any(r["healthy"] for r in rows)
        return {"status": "ok" if ok else "unavailable", "backends": rows}

    def metrics_text(self, s: Stats, clients: int) -> str:
        """Render the proxy's counters in Prometheus text format."""
        p = "synthbatch_proxy_"
        now = time.monotonic()
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
        out += [f'{p}errors_total{{status="{k}"}} {v}' for k, v in sorted(s.errors_total.items())]
        out += [
            f"# TYPE {p}bytes_in_total counter",
            f"{p}bytes_in_total {s.bytes_in}",
            f"# TYPE {p}bytes_out_total counter",
            f"{p}bytes_out_total {s.bytes_out}",
            f"# TYPE {p}client_connections gauge",
            f"{p}client_connections {clients}",
            f"# TYPE {p}affinity_total counter",
            f'{p}affinity_total{{result="hit"}} {s.affinity_hits_total}',
            f'{p}affinity_total{{result="fallback"}} {s.affinity_fallbacks_total}',
            f"# TYPE {p}timed_requests_total counter",
            f"{p}timed_requests_total {s.timed_total}",
            f"# TYPE {p}queue_seconds_total counter",
            f"{p}queue_seconds_total {s.queue_s_total:.6f}",
            f"# TYPE {p}upstream_seconds_total counter",
            f"{p}upstream_seconds_total {s.upstream_s_total:.6f}",
        ]
        for name, kind, fn in (
            ("in_flight", "gauge", lambda b: b.in_flight),
            ("backend_requests_total", "counter", lambda b: b.requests),
            ("backend_healthy", "gauge", lambda b: int(now >= b.down_until)),
            ("backend_queued", "gauge", lambda b: self.queued(b, now)),
            ("backend_prefix_cache_hit_ratio", "gauge", _hit_ratio),
        ):
            out.append(f"# TYPE {p}{name} {kind}")
            for b in self.backends:
                value = fn(b)
                if value is not None:
                    out.append(f'{p}{name}{{backend="{b.url}"}} {value}')
        return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------
# Queue sampler (not on the hot path: one thread per backend, blocking http.client)


class Sampler:
    """Polls every backend's ``/metrics`` about every ``metrics_interval`` seconds.

    One daemon thread per backend, each with a kept-alive connection, so a slow backend
    never delays the others or the event loop. Samples are plain attribute stores on the
    backend; passive-health notes go to the loop thread through ``call`` (the loop's
    ``call_threadsafe``). A failed sample leaves the previous value, which turns
    "unknown" (fail open) once it is older than the router's ``stale_after``; errors never
    stop the sampler.
    """

    def __init__(self, router: Router, call: Callable[..., None]) -> None:
        self.router = router
        self.call = call
        self.interval = router.config.metrics_interval
        self.timeout = min(1.0, max(0.2, 5 * self.interval))
        self.stopped = threading.Event()
        self.threads: List[threading.Thread] = []

    def start(self) -> None:
        """Start one sampling thread per backend."""
        for b in self.router.backends:
            t = threading.Thread(target=self._run, args=(b,), name=f"sampler-{b.index}")
            t.daemon = True
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        """Ask the threads to stop (they exit within one interval + timeout)."""
        self.stopped.set()

    def _run(self, b: Backend) -> None:
        """Sample one backend until stopped."""
        conn: Optional[http.client.HTTPConnection] = None
        while not self.stopped.wait(self.interval):
            if conn is None:
                conn = http.client.HTTPConnection(b.host, b.port, timeout=self.timeout)
            try:
                waiting = self._sample(conn, b)
            except ConnectionRefusedError as exc:
                conn.close()
                conn = None
                self.call(self.router.note_failure, b, f"metrics connect: {exc}")
                continue
            except Exception as exc:  # never let the sampler die
                conn.close()
                conn = None
                LOG.debug("sampling %s failed: %s", b.url, exc)
                continue
            b.sampled_waiting = waiting
            b.sample_ok_at = time.monotonic()
            self.call(self.router.note_success, b)
        if conn is not None:
            conn.close()

    def _sample(self, conn: http.client.HTTPConnection, b: Backend) -> Optional[float]:
        """GET /metrics once; the queue length (None: no queue metric or not 200)."""
        conn.request("GET", f"{b.prefix}/metrics", headers={"Accept": "text/plain"})
        response = conn.getresponse()
        body = response.read(MAX_METRICS_BYTES + 1)
        if len(body) > MAX_METRICS_BYTES:
            raise ValueError("metrics too large")
        if response.will_close:
            conn.close()
        if response.status != 200:
            return None
        text = body.decode("utf-8", "replace")
        b.prefix_cache = parse_prefix_cache(text)
        return parse_queue_metric(text)


def _hit_ratio(b: Backend) -> Optional[float]:
    """The share of prompt tokens a backend found in its prefix cache (None: unknown)."""
    if b.prefix_cache is None or b.prefix_cache[0] <= 0:
        return None
    return round(b.prefix_cache[1] / b.prefix_cache[0], 4)
