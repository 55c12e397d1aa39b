"""How many requests the generator keeps in flight per model alias when none is configured.

The generator starts at ``START_PER_REPLICA`` requests per replica (fewer when the
deployment's ``max_queued_requests`` is lower: the proxy answers 429 once more than that
many wait on every replica, so a start below it is never shed) and then follows the
latency-aware limit of ``agent_stdlib/client/concurrency.py``, which settles near the
engine's knee. The ceiling, ``OPEN_CEILING_PER_REPLICA`` per replica, is only a safety
bound: latency, not the proxy's queue limit, keeps the engine's queue short, so an
engine whose batch is larger than ``max_queued_requests`` is still filled. The start is
high because an engine's first round trip is spent at whatever the start is: at 32 a
replica of capacity 128 ran a quarter full for its first second (a 10 s job at 0.81 of
the engine's rate); past the knee the limit comes down within a few round trips.
"""

from __future__ import annotations

from typing import Tuple

START_PER_REPLICA = 128
OPEN_CEILING_PER_REPLICA = 1024


def bounds(replicas: int, max_queued_requests: int) -> Tuple[int, int]:
    """(start, ceiling) of the adaptive concurrency of one alias."""
    ceiling = max(1, replicas) * OPEN_CEILING_PER_REPLICA
    per_replica = min(START_PER_REPLICA, max_queued_requests or START_PER_REPLICA)
    return max(1, replicas) * per_replica, ceiling
