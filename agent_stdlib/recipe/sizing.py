"""How many requests the generator keeps in flight per model alias when none is configured.

The generator starts at ``START_PER_REPLICA`` requests per replica and grows (AIMD,
``agent_stdlib/client/concurrency.py``) up to a ceiling of ``max_queued_requests`` per
replica: the proxy answers 429 only when a replica's engine has more than
``max_queued_requests`` requests *waiting*, and in-flight requests can never exceed that
many waiting ones, so the generator's own load is never shed while it keeps the engine's
queue non-empty. With ``max_queued_requests`` at least the engine's batch size (vLLM's
``max_num_seqs``, 256 by default; llama.cpp's ``-np``) the engine stays saturated, and
the halving after a 429 from anything else leaves it saturated too. ``max_queued_requests
= 0`` sheds as soon as anything waits: the generator then finds the engine's capacity by
AIMD alone, up to ``OPEN_CEILING_PER_REPLICA``.
"""

from __future__ import annotations

from typing import Tuple

START_PER_REPLICA = 32
OPEN_CEILING_PER_REPLICA = 1024


def bounds(replicas: int, max_queued_requests: int) -> Tuple[int, int]:
    """(start, ceiling) of the adaptive concurrency of one alias."""
    per_replica = max_queued_requests or OPEN_CEILING_PER_REPLICA
    ceiling = max(1, replicas) * per_replica
    return min(ceiling, START_PER_REPLICA * max(1, replicas)), ceiling
