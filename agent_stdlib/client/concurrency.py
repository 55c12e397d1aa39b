"""Requests in flight per model alias: a fixed limit, or an adaptive one when the run sets
none.

Adaptive (``LatencyLimit``, pure arithmetic over answers' times and latencies;
``Limiter`` applies it to a priority semaphore): start at ``start``
(``agent_stdlib.recipe.sizing``) and grow by one per answer whose latency is good (slow
start: doubling per round trip), but never past twice the most answers that came back
good within one round trip (``Rounds``): an engine already full when slow start doubles
answers only its capacity good in the next round (the rest queue and answer a round
later), so the limit stops at twice that instead of doubling again on the answers of
the requests that got a slot. Good means within ``TOLERANCE`` x the lowest latency seen
for that kind of request (per column: a judge and a long answer have different
latencies). The first slower answer ends slow start;
from then on each answer moves the limit a ``1/limit`` step toward a gradient target,
``in_flight x min(1, TOLERANCE x lowest / latency) + sqrt(limit)`` (the gradient at most
halves it), as Netflix concurrency-limits' Gradient2 does, but over the requests actually
out rather than the limit (the answer's latency reflects them); leaving slow start goes
to that target at once, since slow start overshoots by up to a round trip's doubling,
and the answers to requests sent before that cut do not move the limit again (they
report the queue already cut: one reaction per round trip, as for a halving; following
them would drain the engine below its capacity).
Past an engine's capacity the extra requests only wait, so latency grows in proportion
to the requests in flight (Little's law) and ``in_flight x lowest / latency`` is the
engine's capacity: the limit settles where latency is about ``TOLERANCE`` x the
unqueued one, near the engine's knee, with a short queue kept so that the engine never
idles. The lowest latency is only seen by a request that did not wait: when the start
was already past the knee it is too high and the limit too. So ``FIRST_PROBE`` round
trips after slow start, and every ``PROBE_EVERY`` after that, a probe drops the limit
to half the estimated capacity until the backlog has answered (the engine stays busy on
the backlog; about half a round trip at three quarters of its rate), then goes back to
the limit before it; the requests sent during the probe did not wait, and their
latency lowers the gradient's target (BBR's and Vegas's minimum-RTT probes do the
same). Latencies under ``NOISE_FLOOR_S``
are taken as equal (an instant server's answers
differ only by scheduling noise).

A 429, 503 or timeout still halves the limit and ends slow start; only one halving per
round trip: a signal from a request sent before the last halving is the same congestion
seen late, not new congestion. Waiting requests are served lowest priority first (the
record index), so older records finish first and the writer's reorder buffer stays
small.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from typing import Dict, List, Tuple

TOLERANCE = 1.25  # latency up to 1.25 x the lowest counts as good (Gradient2: 1.5)
MIN_GRADIENT = 0.5  # one answer's latency can at most halve the target
NOISE_FLOOR_S = 0.05  # latencies below this are all "instant"
FIRST_PROBE = 4  # round trips after slow start ends, then every PROBE_EVERY
PROBE_EVERY = 30


class Rounds:
    """Slow start's cap: twice the most answers that came back good within one round trip.

    A round ends when a request sent after it began answers (TCP's round trips); rounds
    are counted per kind of request (a judge's round trip is longer than a short
    column's) and the cap adds up the kinds' best rounds. Growing by one per good answer
    doubles the limit per round; the cap stops the second doubling of an engine that is
    already full: past its capacity only ``capacity`` requests answer good within a
    round (the rest wait and answer a round later, slow), so the limit stays at twice
    what the engine served unqueued instead of growing on the good answers of the
    requests that got a slot while their twins queued. The start counts as a round served
    (the first round may double it).
    """

    def __init__(self, start: int) -> None:
        self.start = max(1, start)
        self.began: Dict[str, float] = {}  # per kind: monotonic time its round began
        self.count: Dict[str, int] = {}  # per kind: good answers in its current round
        self.best: Dict[str, int] = {}  # per kind: most good answers in one round

    def good(self, sent_at: float, now: float, key: str = "") -> float:
        """A good answer at ``now`` to a request of kind ``key`` sent at ``sent_at``; the
        cap on the limit."""
        if key not in self.began or sent_at >= self.began[key]:
            self.began[key], self.count[key] = now, 0  # sent after the round began: next
        self.count[key] += 1
        self.best[key] = max(self.best.get(key, 0), self.count[key])
        return 2.0 * max(self.start, sum(self.best.values()))


class LatencyLimit:
    """The adaptive limit's arithmetic: fed answers' latencies and congestion, no I/O."""

    def __init__(self, start: int, ceiling: int, tolerance: float = TOLERANCE) -> None:
        self.ceiling = max(1, ceiling)
        self.limit = float(max(1, min(start, self.ceiling)))
        self.tolerance = tolerance
        self.slow_start = True
        self.lowest: Dict[str, float] = {}  # per kind of request: its lowest latency
        self.until_probe = 0.0  # answers until the next probe
        self.probe_left = 0.0  # while probing: answers until it ends
        self.probe_from = 0.0  # while probing: the limit before it
        self.rounds = Rounds(start)
        self.earned = self.limit  # slow start: the start + one per good answer
        self.cut_at = -math.inf  # when slow start ended (monotonic time)

    def answered(self, latency: float, in_flight: int, key: str = "", *,
                 now: float) -> None:
        """An answer came back at monotonic time ``now``, ``latency`` seconds after it was
        sent, with ``in_flight`` requests out (itself included): grow, probe, or move
        toward the gradient's target."""
        latency = max(latency, NOISE_FLOOR_S)
        lowest = min(self.lowest.get(key, latency), latency)
        self.lowest[key] = lowest
        gradient = min(1.0, self.tolerance * lowest / latency)
        if self.probe_left > 0:
            self._probing()
            return
        if self.slow_start:
            if gradient >= 1.0:
                self.earned += 1.0
                cap = self.rounds.good(now - latency, now, key)
                self.limit = max(self.limit, min(float(self.ceiling), self.earned, cap))
                return
            self.slow_start = False
            self.until_probe = FIRST_PROBE * self.limit
            # slow start overshoots by up to a round trip's doubling: go straight down
            self.limit = max(1.0, min(self.limit, self._target(gradient, in_flight)))
            self.cut_at = now
            return
        if now - latency < self.cut_at:
            return  # sent before the cut: the queue it reports is the one already cut
        target = self._target(max(MIN_GRADIENT, gradient), in_flight)
        self.limit = max(1.0, min(float(self.ceiling),
                                  self.limit + (target - self.limit) / self.limit))
        self.until_probe -= 1
        if self.until_probe <= 0:
            self._start_probe(in_flight, lowest / latency)

    def _target(self, gradient: float, in_flight: int) -> float:
        """What the engine serves without queueing (Little's law: the requests out x the
        unqueued over the measured latency), with the tolerance's queue and sqrt(limit)
        to probe for more."""
        return max(1, in_flight) * gradient + math.sqrt(self.limit)

    def _start_probe(self, in_flight: int, ratio: float) -> None:
        """Let the engine's queue drain for a moment, so that requests sent then do not
        wait and show the unqueued latency again (the lowest seen may date from a start
        that was already over-queued): half the engine's estimated capacity until the
        requests out now (the backlog) have answered."""
        self.probe_left = float(in_flight)
        self.probe_from = self.limit
        self.limit = min(self.limit, max(1.0, in_flight * ratio / 2))

    def _probing(self) -> None:
        """One answer during a probe; at its end, back to the limit before it (the
        probe's own requests, answered later, lower the lowest latency and so the
        gradient's target)."""
        self.probe_left -= 1
        if self.probe_left > 0:
            return
        self.probe_left = 0.0
        self.limit = self.probe_from
        self.until_probe = PROBE_EVERY * self.limit

    def congested(self) -> None:
        """A 429, 503 or timeout: halve and end slow start."""
        self.limit = max(1.0, self.limit / 2)
        if self.slow_start:
            self.slow_start = False
            self.until_probe = FIRST_PROBE * self.limit


class Limiter:
    """A priority semaphore whose size follows ``LatencyLimit`` (or stays fixed)."""

    def __init__(self, start: int, ceiling: int, adaptive: bool = True) -> None:
        self.rule = LatencyLimit(start, ceiling)
        self.adaptive = adaptive
        self.in_flight = 0
        self.cut_at = 0.0  # monotonic time of the last halving
        self._waiters: List[Tuple[int, int, asyncio.Future]] = []
        self._seq = 0

    @property
    def ceiling(self) -> int:
        """The highest the limit may go."""
        return self.rule.ceiling

    @property
    def slow_start(self) -> bool:
        """Still growing by one per answer (no congestion, no latency rise yet)."""
        return self.adaptive and self.rule.slow_start

    @property
    def current(self) -> int:
        """The limit as a whole number of requests."""
        return int(self.rule.limit)

    async def acquire(self, priority: int) -> float:
        """Wait for a slot; returns when the request may be sent (monotonic time)."""
        if self.in_flight < self.current and not self._waiters:
            self.in_flight += 1
            return time.monotonic()
        future = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._waiters, (priority, self._seq, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot was handed over just as we were cancelled
            raise
        return time.monotonic()

    def release(self) -> None:
        """Give a slot back."""
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.current:
            _, _, future = heapq.heappop(self._waiters)
            if future.done():
                continue  # cancelled while waiting
            self.in_flight += 1
            future.set_result(None)

    def succeeded(self, sent_at: float, key: str = "") -> None:
        """An answer came back for a request sent at ``sent_at`` (of kind ``key``)."""
        if not self.adaptive:
            return
        now = time.monotonic()
        self.rule.answered(now - sent_at, self.in_flight + 1, key, now=now)
        self._wake()

    def congested(self, sent_at: float) -> None:
        """A 429/503/timeout for a request sent at ``sent_at``: halve, once per round trip."""
        if not self.adaptive or sent_at < self.cut_at:
            return
        self.rule.congested()
        self.cut_at = time.monotonic()
