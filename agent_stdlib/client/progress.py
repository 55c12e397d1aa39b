"""The generator's counters: ``progress.json`` about once a second, a log line every ~10 s.

``records_done`` counts every record settled (generated, copied from an earlier attempt
or dropped); the rate is records settled per second over the last ``WINDOW_S`` seconds of
this execution (what an ETA needs), leaving out the records every LLM cell of which was
reused from an earlier run (issue 31: the rate is generated work). LLM cells reused and
generated are counted apart. Per alias: requests answered, prompt and completion
tokens the engine reported, errors by kind, and the current concurrency limit.
"""

from __future__ import annotations

import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import Deque, Dict, List, Optional, Tuple

from ..contracts import AliasProgress, ColumnTokens, ProgressRecord
from ..statefile import write_json_atomic
from .cachestats import ProxySampler, cache_view
from .concurrency import Limiter

WINDOW_S = 30.0
WRITE_S = 1.0
LOG_S = 10.0


class AliasCounters:
    """Traffic to one alias."""

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        self.requests = self.tokens_in = self.tokens_out = self.cached = 0
        self.errors: Counter = Counter()
        # column -> [requests, tokens in, tokens out, latencies' sum in s]
        self.columns: Dict[str, List[float]] = {}
        self.sampler: Optional[ProxySampler] = None  # the proxy's affinity counters

    def answered(self, usage: Dict[str, object], cached: int = 0,
                 column: Optional[str] = None, latency_s: float = 0.0) -> None:
        """Count one answered request, the tokens it reports and its ``cached`` prompt
        tokens (``cachestats.cached_tokens``); ``column``: the LLM column that asked, whose
        answer took ``latency_s`` seconds (sent -> answer)."""
        self.requests += 1
        tokens_in = _count(usage.get("prompt_tokens"))
        tokens_out = _count(usage.get("completion_tokens"))
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.cached += cached
        if column is not None:
            part = self.columns.setdefault(column, [0, 0, 0, 0.0])
            part[0] += 1
            part[1] += tokens_in
            part[2] += tokens_out
            part[3] += latency_s

    def view(self) -> AliasProgress:
        """The alias's figures as a progress record part."""
        return AliasProgress(requests=self.requests, tokens_in=self.tokens_in,
                             tokens_out=self.tokens_out, errors=dict(self.errors),
                             concurrency=self.limiter.current,
                             in_flight=self.limiter.in_flight,
                             cache=cache_view(self.cached, self.sampler),
                             columns={c: ColumnTokens(int(p[0]), int(p[1]), int(p[2]),
                                                      round(p[3], 3))
                                      for c, p in sorted(self.columns.items())})


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else 0


class Progress:
    """Counts settled records and tokens; publishes them (see the module docstring)."""

    def __init__(self, path: Optional[Path], total: int) -> None:
        self.path, self.total = path, total
        self.done = self.dropped = self.tokens = 0
        self.reused = self.generated = self.records_reused = 0  # LLM cells; issue 31
        self.aliases: Dict[str, AliasCounters] = {}  # set by the generator
        self.started = time.monotonic()
        self.started_at = time.time()
        self.first_record_at: Optional[float] = None
        self._samples: Deque[Tuple[float, int]] = deque([(self.started, 0)])
        self._written = 0.0
        self._logged = self.started  # the first line after LOG_S

    def start_at(self, done: int, dropped: int, tokens: int) -> None:
        """What earlier executions already settled."""
        self.done, self.dropped, self.tokens = done, dropped, tokens
        self._samples = deque([(time.monotonic(), done)])

    def settled(self, tokens: int = 0, dropped: bool = False, count: int = 1) -> None:
        """``count`` records are done (with ``tokens`` completion tokens between them)."""
        self.done += count
        if self.first_record_at is None:
            self.first_record_at = time.time()
        self.tokens += tokens
        self.dropped += count if dropped else 0

    def cells(self, reused: int, generated: int) -> None:
        """One settled record had ``reused`` LLM cells taken from earlier runs and
        ``generated`` ones asked of a model (issue 31)."""
        self.reused += reused
        self.generated += generated
        if reused and not generated:
            self.records_reused += 1

    def rate(self, now: float) -> float:
        """Records settled per second over the last ``WINDOW_S`` seconds, reused ones
        left out."""
        self._samples.append((now, self.done - self.records_reused))
        while len(self._samples) > 2 and now - self._samples[1][0] >= WINDOW_S:
            self._samples.popleft()
        first_at, first_done = self._samples[0]
        return (self.done - self.records_reused - first_done) / max(1e-6, now - first_at)

    def tick(self, force: bool = False) -> None:
        """Write ``progress.json`` once a second and the log line every ``LOG_S``."""
        now = time.monotonic()
        if force or now - self._written >= WRITE_S:
            self._written = now
            self.write(now)
        if now - self._logged >= LOG_S and not force:
            self._logged = now
            print(f"generate: {self.line(now)}", file=sys.stderr, flush=True)

    def write(self, now: Optional[float] = None) -> None:
        """Publish the counters now."""
        if self.path is None:
            return
        record = ProgressRecord(
            records_done=self.done, records_total=self.total, tokens=self.tokens,
            requests_per_s=self.rate(time.monotonic() if now is None else now),
            updated_at=time.time(), records_dropped=self.dropped,
            aliases={a: c.view() for a, c in sorted(self.aliases.items())},
            started_at=self.started_at, first_record_at=self.first_record_at,
            cells_reused=self.reused, cells_generated=self.generated,
            records_reused=self.records_reused)
        write_json_atomic(self.path, record.to_dict())

    def line(self, now: float) -> str:
        """``120/400 records (2 dropped), 3.1 records/s; gen 64/64 in flight, ...``."""
        text = (f"{self.done}/{self.total} records"
                + (f" ({self.dropped} dropped)" if self.dropped else "")
                + f", {self.rate(now):.1f} records/s"
                + (f", reused {self.reused} of {self.reused + self.generated} cells"
                   if self.reused else ""))
        for alias, c in sorted(self.aliases.items()):
            errors = ", ".join(f"{k} x{v}" for k, v in sorted(c.errors.items()))
            text += (f"; {alias} {c.limiter.in_flight}/{c.limiter.current} in flight, "
                     f"{c.requests} requests" + (f", errors {errors}" if errors else ""))
        return text
