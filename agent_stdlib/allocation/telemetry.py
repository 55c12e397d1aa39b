"""Serving telemetry (issue 32): what each replica's engine and each alias's proxy report.

One daemon thread of the agent samples, every ``SYNTHBATCH_TELEMETRY_S`` seconds (default
``INTERVAL_S``; 0 turns sampling off), each replica's own ``/metrics`` (vLLM, SGLang and
llama.cpp names, :data:`ENGINE_METRICS`; llama.cpp without ``--metrics`` answers
``/slots``) and each proxy's ``/metrics``: one short GET each, ``TIMEOUT_S`` at most, in
the agent process, never in the client's. The last values per replica and a time series
go to the attempt's ``telemetry.json`` (``TelemetryRecord``), rewritten after each sample.

Size bound: the series keeps at most ``MAX_POINTS`` points (one hour at 5 s) and the file
is trimmed, oldest points first, to ``MAX_BYTES`` (1 MB): at most 1 MB of state per
attempt whatever its length, so at most 1 MB per shard-hour. A point is ~25 bytes plus
~30 per replica: 720 points of 2 replicas are ~60 KB.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from ..contracts import (
    ProxyTelemetry,
    ReplicaTelemetry,
    TelemetryPoint,
    TelemetryRecord,
)
from ..proxy.config import parse_backend_url
from ..proxy.http import metric_by_label, metric_sums, parse_prefix_cache
from ..statefile import write_bytes_atomic

INTERVAL_S = 5.0
INTERVAL_ENV = "SYNTHBATCH_TELEMETRY_S"
TIMEOUT_S = 1.0
MAX_BODY = 4 * 1024 * 1024
MAX_POINTS = 720
MAX_BYTES = 1024 * 1024

# figure -> the names each engine exports it under (first found wins)
ENGINE_METRICS: Dict[str, Dict[str, Tuple[str, ...]]] = {
    "vllm": {"running": ("vllm:num_requests_running",),
             "waiting": ("vllm:num_requests_waiting",),
             # vLLM V1 (>= 0.10) exports kv_cache_usage_perc; older ones gpu_cache_usage_perc
             "kv": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
             "gen": ("vllm:generation_tokens_total",)},
    "sglang": {"running": ("sglang:num_running_reqs",),
               "waiting": ("sglang:num_queue_reqs",),
               "kv": ("sglang:token_usage",),
               "gen": ("sglang:generation_tokens_total",),
               "queries": ("sglang:prompt_tokens_total",),
               "hits": ("sglang:cached_tokens_total",)},
    "llamacpp": {"running": ("llamacpp:requests_processing",),
                 "waiting": ("llamacpp:requests_deferred",),
                 "kv": ("llamacpp:kv_cache_usage_ratio",),
                 "gen": ("llamacpp:tokens_predicted_total",)},
}
PROXY = "synthbatch_proxy_"


# (engine, figure -> value): running, waiting, kv, gen (a counter), queries/hits (the
# prefix cache's counters, in tokens)
EngineFigures = Tuple[str, Dict[str, float]]


def parse_engine_metrics(text: str) -> Optional[EngineFigures]:
    """The figures of an engine's Prometheus text (vLLM, SGLang or llama.cpp names);
    None when it has none of them."""
    for engine, names in ENGINE_METRICS.items():
        wanted = tuple(n for group in names.values() for n in group)
        sums = metric_sums(text, wanted)
        if not sums:
            continue
        out: Dict[str, float] = {}
        for figure, group in names.items():
            found = [sums[n] for n in group if n in sums]
            if found:
                out[figure] = found[0]
        cache = parse_prefix_cache(text)
        if cache is not None:
            out["queries"], out["hits"] = cache
        return engine, out
    return None


def parse_slots(body: str) -> Optional[EngineFigures]:
    """llama.cpp's ``/slots`` (JSON list of slots): running = slots processing."""
    try:
        slots = json.loads(body)
    except ValueError:
        return None
    if not isinstance(slots, list):
        return None
    busy = 0
    for slot in slots:
        if isinstance(slot, dict) and (slot.get("is_processing") is True
                                       or slot.get("state") not in (None, 0)):
            busy += 1
    return "llamacpp", {"running": float(busy)}


def parse_proxy_metrics(text: str) -> Tuple[ProxyTelemetry, Dict[str, int]]:
    """(the proxy's counters, replica URL -> requests in flight) from its ``/metrics``."""
    names = ("requests_total", "retries_total", "responses_429_total",
             "timed_requests_total", "queue_seconds_total", "upstream_seconds_total")
    raw = metric_sums(text, tuple(PROXY + n for n in names))
    sums = {n: raw.get(PROXY + n, 0.0) for n in names}
    counters = ProxyTelemetry(requests=int(sums["requests_total"]),
                              responses_429=int(sums["responses_429_total"]),
                              retries=int(sums["retries_total"]),
                              timed=int(sums["timed_requests_total"]),
                              queue_s=round(sums["queue_seconds_total"], 3),
                              upstream_s=round(sums["upstream_seconds_total"], 3))
    flights = metric_by_label(text, f"{PROXY}in_flight", "backend")
    return counters, {url: int(v) for url, v in flights.items()}


def replica_view(alias: str, url: str, figures: EngineFigures, at: float,
                 before: Optional[Tuple[float, EngineFigures]],
                 in_flight: Optional[int]) -> ReplicaTelemetry:
    """One replica's sample, rates from the counters' change since ``before`` (the time
    and figures of the previous sample)."""
    engine, now = figures
    tok_s = hit = None
    if before is not None and at > before[0]:
        then = before[1][1]
        if "gen" in now and "gen" in then and now["gen"] >= then["gen"]:
            tok_s = round((now["gen"] - then["gen"]) / (at - before[0]), 2)
        asked = now.get("queries", 0.0) - then.get("queries", 0.0)
        if asked > 0:
            hit = round(max(0.0, now.get("hits", 0.0) - then.get("hits", 0.0)) / asked, 4)
    if hit is None and now.get("queries", 0.0) > 0:
        hit = round(now.get("hits", 0.0) / now["queries"], 4)
    kv = now.get("kv")
    return ReplicaTelemetry(alias=alias, url=url, engine=engine,
                            running=now.get("running"), waiting=now.get("waiting"),
                            kv_cache_usage=None if kv is None else
                            round(min(1.0, max(0.0, kv)), 4),
                            prefix_hit_rate=hit, gen_tokens_per_s=tok_s,
                            proxy_in_flight=in_flight)


def point(at: float, replicas: Sequence[ReplicaTelemetry]) -> TelemetryPoint:
    """The series point of one sample."""
    return TelemetryPoint(at=round(at, 2), values=tuple(
        (r.running, r.waiting, r.kv_cache_usage, r.gen_tokens_per_s,
         None if r.proxy_in_flight is None else float(r.proxy_in_flight)) for r in replicas))


def encode(record: TelemetryRecord, max_bytes: int = MAX_BYTES) -> bytes:
    """``telemetry.json``'s bytes (compact JSON), oldest points dropped until it fits
    ``max_bytes``."""
    data = record.to_dict()
    series = data["series"]
    while True:
        payload = json.dumps(data, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        if len(payload) <= max_bytes or not series:
            return payload
        drop = max(1, len(series) * (len(payload) - max_bytes) // len(payload) + 1)
        del series[:drop]


def interval_from_env(env: Mapping[str, str]) -> float:
    """The sampling interval ``SYNTHBATCH_TELEMETRY_S`` asks for (0: off), else the default."""
    try:
        value = float(env.get(INTERVAL_ENV, INTERVAL_S))
    except ValueError:
        return INTERVAL_S
    return value if value >= 0 else INTERVAL_S


def _get(url: str, path: str) -> Tuple[int, str]:
    host, port, prefix = parse_backend_url(url)
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", prefix + path, headers={"Accept": "text/plain"})
        reply = conn.getresponse()
        return reply.status, reply.read(MAX_BODY).decode("utf-8", "replace")
    finally:
        conn.close()


class Telemetry:
    """Samples the replicas and proxies of one execution into ``telemetry.json``."""

    def __init__(self, path: Path, interval: float = INTERVAL_S) -> None:
        self.path, self.interval = path, interval
        self.urls: Dict[str, List[str]] = {}  # alias -> replica URLs
        self.proxies: Dict[str, str] = {}  # alias -> proxy URL
        self.times: Dict[str, Optional[float]] = {"started_at": time.time()}
        self.last: Dict[Tuple[str, str], ReplicaTelemetry] = {}
        self.counters: Dict[str, ProxyTelemetry] = {}
        self.before: Dict[Tuple[str, str], Tuple[float, EngineFigures]] = {}
        self.series: Deque[TelemetryPoint] = deque(maxlen=MAX_POINTS)
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.thread: Optional[threading.Thread] = None

    def mark(self, name: str) -> None:
        """Note the wall time of ``name`` (ready_at, stopping_at, stopped_at) and publish."""
        self.times[name] = time.time()
        self.write()

    def start(self, urls: Mapping[str, Sequence[str]], proxies: Mapping[str, str]) -> None:
        """Begin sampling these replicas and proxies (no thread when the interval is 0)."""
        self.urls = {a: list(u) for a, u in urls.items()}
        self.proxies = dict(proxies)
        if self.interval > 0 and self.thread is None:
            self.thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        """Stop sampling (the thread ends within one GET's timeout)."""
        self.stopped.set()

    def _run(self) -> None:
        """Sample at once (the engines as they start serving), then every interval."""
        while not self.stopped.is_set():
            try:
                self.sample()
            except Exception as err:  # noqa: BLE001 - telemetry never fails an attempt
                print(f"agent: telemetry sample failed: {type(err).__name__}: {err}",
                      file=sys.stderr, flush=True)
            self.stopped.wait(self.interval)

    def sample(self) -> None:
        """One round: every proxy, then every replica; then write ``telemetry.json``."""
        flights: Dict[str, int] = {}
        for alias, url in self.proxies.items():
            try:
                status, body = _get(url, "/metrics")
            except (OSError, http.client.HTTPException):
                continue
            if status == 200:
                counters, inflight = parse_proxy_metrics(body)
                with self.lock:  # record() may be copying it on the agent's thread
                    self.counters[alias] = counters
                flights.update(inflight)
        for alias, urls in self.urls.items():
            for url in urls:
                self._replica(alias, url, flights.get(url.rstrip("/")))
        with self.lock:
            replicas = [self.last[k] for k in sorted(self.last)]
            self.series.append(point(time.time(), replicas))
        if not self.stopped.is_set():
            self.write()

    def _replica(self, alias: str, url: str, in_flight: Optional[int]) -> None:
        key, at = (alias, url), time.time()
        try:
            status, body = _get(url, "/metrics")
            figures = parse_engine_metrics(body) if status == 200 else None
            if figures is None:
                status, body = _get(url, "/slots")
                figures = parse_slots(body) if status == 200 else None
            error = None if figures is not None else f"no engine metrics (HTTP {status})"
        except (OSError, http.client.HTTPException) as err:
            figures, error = None, f"{type(err).__name__}: {err}"[:200]
        if self.stopped.is_set():  # the servers are being stopped: keep the last values
            return
        if figures is None:
            old = self.last.get(key, ReplicaTelemetry(alias=alias, url=url))
            view = replace(old, error=error, proxy_in_flight=in_flight)
        else:
            view = replica_view(alias, url, figures, at, self.before.get(key), in_flight)
            self.before[key] = (at, figures)
        with self.lock:  # record() may be reading it on the agent's thread
            self.last[key] = view

    def record(self) -> TelemetryRecord:
        """What ``telemetry.json`` says now."""
        with self.lock:
            return TelemetryRecord(
                interval_s=self.interval, updated_at=time.time(),
                replicas=tuple(self.last[k] for k in sorted(self.last)),
                proxies=dict(self.counters), series=tuple(self.series), **self.times)

    def write(self) -> None:
        """Publish ``telemetry.json`` (a failure to write is reported, never raised)."""
        try:
            write_bytes_atomic(self.path, encode(self.record()))
        except OSError as err:
            print(f"agent: cannot write {self.path}: {err}", file=sys.stderr, flush=True)


def from_env(path: Path) -> Telemetry:
    """A sampler at the interval the environment asks for."""
    return Telemetry(path, interval_from_env(os.environ))
