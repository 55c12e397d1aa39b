"""Splitting a run's shards into Slurm arrays that respect ``MaxArraySize`` (pure).

Slurm refuses array task ids >= ``MaxArraySize``. Shards are cut into consecutive chunks
of at most that many; how a shard maps to its array, task and job id is
``agent_stdlib.arrays`` (one home, shared with the agent); the cluster's limit is read by
``control.slurm.scheduler.Scheduler.max_array_size``.
"""

from __future__ import annotations

from typing import Optional, Tuple

from agent_stdlib.contracts import ArraySpec


def array_chunks(shards: int, max_array_size: Optional[int] = None) -> Tuple[ArraySpec, ...]:
    """Consecutive chunks of at most ``max_array_size`` shards (one chunk if unknown)."""
    size = max_array_size or shards
    return tuple(ArraySpec(index=i, first_shard=first, count=min(size, shards - first))
                 for i, first in enumerate(range(0, shards, size)))
