"""Prefix-cache reuse and affinity routing for ``progress.json`` (issue 30).

Two sources, both plain numbers: each answer's cached prompt tokens (llama.cpp's
``timings.cache_n``, OpenAI's ``usage.prompt_tokens_details.cached_tokens``), counted by
the generator; and the proxy's own ``/metrics`` (``synthbatch_proxy_affinity_total`` hits
and load-bound fallbacks, ``synthbatch_proxy_backend_prefix_cache_hit_ratio`` per
replica), sampled by one daemon thread per alias, off the event loop. An endpoint that is
not a synthbatch proxy (a preview against an engine) simply yields no proxy figures.
"""

from __future__ import annotations

import http.client
import re
import threading
from typing import Any, Dict, Optional, Tuple
from urllib.parse import urlsplit

from ..contracts import CacheProgress

SAMPLE_S = 2.0
PREFIX = "synthbatch_proxy_"
_LINE = re.compile(r'^synthbatch_proxy_(affinity_total|backend_prefix_cache_hit_ratio)'
                   r'\{(result|backend)="([^"]*)"\} ([0-9.eE+-]+)$', re.M)


def cached_tokens(data: Any) -> int:
    """The prompt tokens an answer says came from the engine's prefix cache (0 if none)."""
    if not isinstance(data, dict):
        return 0
    usage = data.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    if value is None:
        timings = data.get("timings")
        value = timings.get("cache_n") if isinstance(timings, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def parse_proxy_metrics(text: str) -> Tuple[int, int, Dict[str, float]]:
    """(affinity hits, load-bound fallbacks, replica URL -> prefix-cache hit ratio) from
    the proxy's Prometheus text; lines that do not parse are left out."""
    hits = fallbacks = 0
    rates: Dict[str, float] = {}
    for name, _, label, raw in _LINE.findall(text):
        try:
            value = float(raw)
        except ValueError:
            continue
        if name == "affinity_total" and label == "hit":
            hits = int(value)
        elif name == "affinity_total" and label == "fallback":
            fallbacks = int(value)
        elif name == "backend_prefix_cache_hit_ratio" and 0.0 <= value <= 1.0:
            rates[label] = value
    return hits, fallbacks, rates


class ProxySampler:
    """Polls ``{base_url}/metrics`` every ``interval`` seconds on a daemon thread; the
    latest figures stay readable (``figures``) after a failed sample."""

    def __init__(self, base_url: str, interval: float = SAMPLE_S) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.https = parts.scheme == "https"
        self.interval = interval
        self.latest: Tuple[int, int, Dict[str, float]] = (0, 0, {})
        self.stopped = threading.Event()
        self.thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Start sampling (idempotent)."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="proxy-metrics",
                                           daemon=True)
            self.thread.start()

    def stop(self) -> None:
        """Stop sampling after one last sample."""
        self.stopped.set()
        self.sample()

    def sample(self) -> None:
        """One GET of the proxy's /metrics; a failure leaves the previous figures."""
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=2.0)
        try:
            conn.request("GET", "/metrics")
            reply = conn.getresponse()
            body = reply.read(1 << 20)
            if reply.status == 200:
                figures = parse_proxy_metrics(body.decode("utf-8", "replace"))
                if figures != (0, 0, {}) or PREFIX.encode() in body:
                    self.latest = figures
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.sample()


def cache_view(cached: int, sampler: Optional[ProxySampler]) -> CacheProgress:
    """The alias's reuse figures as a progress record part."""
    hits, fallbacks, rates = sampler.latest if sampler is not None else (0, 0, {})
    return CacheProgress(prompt_tokens_cached=cached, affinity_hits=hits,
                         affinity_fallbacks=fallbacks, replica_hit_rate=dict(rates))


def hit_rate(tokens_in: int, cached: int) -> Optional[float]:
    """Cached share of the prompt tokens, None before any prompt token was counted."""
    return round(cached / tokens_in, 4) if tokens_in > 0 else None
