"""Splitting a run's shards into Slurm arrays that respect ``MaxArraySize`` (pure).

Slurm refuses array task ids >= ``MaxArraySize``. Shards are cut into consecutive chunks
of at most that many; in chunk ``c``, task id ``t`` runs shard ``first_shard + t``.
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

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


def locate(arrays: Sequence[ArraySpec], shard: int) -> Tuple[int, int]:
    """``(array index, task id)`` of ``shard``; ValueError if no array holds it."""
    for spec in arrays:
        if spec.first_shard <= shard < spec.first_shard + spec.count:
            return spec.index, shard - spec.first_shard
    raise ValueError(f"no array holds shard {shard}")


def task_ids(arrays: Sequence[ArraySpec], shards: Sequence[int]) -> List[Tuple[int, List[int]]]:
    """Group ``shards`` (e.g. a retry) by array: ``[(array index, [task ids])]``."""
    grouped: dict = {}
    for shard in sorted(shards):
        index, task = locate(arrays, shard)
        grouped.setdefault(index, []).append(task)
    return sorted(grouped.items())
