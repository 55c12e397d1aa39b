"""Requests in flight per model alias: a fixed limit, or AIMD (additive increase,
multiplicative decrease) when the run sets none.

Adaptive: start at ``start`` (``agent_stdlib.recipe.sizing``), grow by one per answered
request (slow start) up to ``ceiling``; the first 429, 503 or timeout halves the limit
and from then on it grows by about one per round trip (``1/limit`` per answer). Only one
halving per round trip: a signal from a request sent before the last halving is the same
congestion seen late, not new congestion. Waiting requests are served lowest priority
first (the record index), so older records finish first and the writer's reorder buffer
stays small.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from typing import List, Tuple


class Limiter:
    """A priority semaphore whose size follows AIMD (or stays fixed)."""

    def __init__(self, start: int, ceiling: int, adaptive: bool = True) -> None:
        self.limit = float(max(1, min(start, ceiling)))
        self.ceiling = max(1, ceiling)
        self.adaptive = adaptive
        self.in_flight = 0
        self.slow_start = adaptive
        self.cut_at = 0.0  # monotonic time of the last halving
        self._waiters: List[Tuple[int, int, asyncio.Future]] = []
        self._seq = 0

    @property
    def current(self) -> int:
        """The limit as a whole number of requests."""
        return int(self.limit)

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

    def succeeded(self) -> None:
        """An answer came back: grow."""
        if not self.adaptive or self.limit >= self.ceiling:
            return
        self.limit = min(float(self.ceiling),
                         self.limit + (1.0 if self.slow_start else 1.0 / self.limit))
        self._wake()

    def congested(self, sent_at: float) -> None:
        """A 429/503/timeout for a request sent at ``sent_at``: halve, once per round trip."""
        if not self.adaptive or sent_at < self.cut_at:
            return
        self.limit = max(1.0, self.limit / 2)
        self.slow_start = False
        self.cut_at = time.monotonic()
