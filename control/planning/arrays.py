"""Splitting a run's shards into Slurm arrays that respect ``MaxArraySize`` (pure).

Slurm refuses array task ids >= ``MaxArraySize``. Shards are cut into consecutive chunks
of at most that many; how a shard maps to its array, task and job id is
``agent_stdlib.arrays`` (one home, shared with the agent); the cluster's limit is read by
``control.slurm.scheduler.Scheduler.max_array_size``.
"""

from __future__ import annotations

from typing import Optional, Tuple

from synthbatch.agent_stdlib.contracts import ArraySpec


def array_chunks(shards: int, max_array_size: Optional[int] = None,
                 first_task: int = 0) -> Tuple[ArraySpec, ...]:
    """Consecutive chunks of at most ``max_array_size`` tasks (one chunk if unknown).

    ``first_task``: the first chunk's tasks start there (a run sharing one array with
    other runs, ``ArraySpec.first_task``), so it holds ``max_array_size - first_task``
    shards; the others start at task 0. ValueError when ``first_task`` is not below the
    limit (the benchmark's grouping keeps it below: ``control.runs.shared.groups``).
    """
    size = max_array_size or (shards + first_task)
    if first_task and first_task >= size:
        raise ValueError(f"first task {first_task} is not below MaxArraySize {size}")
    chunks, first, task = [], 0, first_task
    while first < shards:
        count = min(size - task, shards - first)
        chunks.append(ArraySpec(index=len(chunks), first_shard=first, count=count,
                                first_task=task))
        first, task = first + count, 0
    return tuple(chunks)
