"""Splitting a run's shards into Slurm arrays that respect ``MaxArraySize`` (pure).

Slurm refuses array task ids >= ``MaxArraySize``. Shards are cut into consecutive chunks
of at most that many; how a shard maps to its array, task and job id is
``agent_stdlib.contracts.array_task`` (one home, shared with the agent).
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

from agent_stdlib.contracts import ArraySpec

MAX_ARRAY_SIZE = re.compile(r"^\s*MaxArraySize\s*=\s*(\d+)\s*$", re.MULTILINE)


def parse_max_array_size(text: str) -> Optional[int]:
    """``MaxArraySize`` from ``scontrol show config`` output; None if absent or invalid."""
    match = MAX_ARRAY_SIZE.search(text)
    if not match:
        return None
    value = int(match.group(1))
    return value if value > 0 else None


def array_chunks(shards: int, max_array_size: Optional[int] = None) -> Tuple[ArraySpec, ...]:
    """Consecutive chunks of at most ``max_array_size`` shards (one chunk if unknown)."""
    size = max_array_size or shards
    return tuple(ArraySpec(index=i, first_shard=first, count=min(size, shards - first))
                 for i, first in enumerate(range(0, shards, size)))
