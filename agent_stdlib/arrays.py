"""The one home of shard -> array -> task -> job id (pure; imports only agent_stdlib.errors).

Slurm refuses array task ids >= ``MaxArraySize``, so the planner cuts a run into arrays
(``Plan.arrays``, each an ``ArraySpec``): task ``t`` of array ``k`` runs shard
``arrays[k].first_shard + t - arrays[k].first_task`` (``first_task`` is 0 unless the run's
tasks share one Slurm array with other runs' tasks, at an offset: benchmark cases of one
shape). A plan without arrays (planned before they existed) is one
array whose task id is the shard index. The job id of one task is ``<array job id>_<task>``.
Submit, crash recovery, cancel, status and the agent all use these functions; ``status``
imports this module without the (slower) contract classes.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from typing import Callable, Iterable, Iterator, Optional, Sequence, Tuple

try:
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8 is not supported anyway
    Protocol = object  # type: ignore[assignment,misc]
from .errors import AgentError


class ArrayError(AgentError, ValueError):
    """A shard, array or task that the plan's arrays do not hold."""


class Array(Protocol):
    """What these functions read of an array (``contracts.ArraySpec``, ``store.ArrayView``)."""

    index: int
    first_shard: int
    count: int
    first_task: int


def array_task(arrays: Sequence[Array], shard: int) -> Tuple[Optional[int], int]:
    """``(array index, task id)`` that runs ``shard``; ``(None, shard)`` without arrays."""
    for spec in arrays:
        if spec.first_shard <= shard < spec.first_shard + spec.count:
            return spec.index, spec.first_task + shard - spec.first_shard
    if arrays:
        raise ArrayError(f"no array of the plan holds shard {shard}")
    return None, shard


def task_finder(arrays: Sequence[Array]) -> Callable[[int], Tuple[Optional[int], int]]:
    """``array_task`` of ``arrays`` in O(log arrays) a shard (a binary search of the
    arrays' first shards), for callers that ask about many shards: a submit of 100,000
    shards in 100 arrays asks for every shard once."""
    ordered = sorted(arrays, key=lambda spec: spec.first_shard)
    starts = [spec.first_shard for spec in ordered]

    def find(shard: int) -> Tuple[Optional[int], int]:
        at = bisect_right(starts, shard) - 1
        spec = ordered[at] if at >= 0 else None
        if spec is not None and shard < spec.first_shard + spec.count:
            return spec.index, spec.first_task + shard - spec.first_shard
        return array_task(arrays, shard)  # no array: (None, shard) or the error

    return find


def array_tasks(arrays: Sequence[Array], shards: Iterable[int]
                ) -> Iterator[Tuple[int, Optional[int], int]]:
    """``(shard, array index, task id)`` for each of ``shards``, as ``array_task`` gives
    (``task_finder``: O(log arrays) a shard)."""
    find = task_finder(arrays)
    for shard in shards:
        yield (shard, *find(shard))


def task_shard(arrays: Sequence[Array], array_index: Optional[int], task: int) -> int:
    """The shard task ``task`` of array ``array_index`` runs (None: the plan's only array)."""
    if not arrays:
        return task
    if array_index is None:
        if len(arrays) > 1:
            raise ArrayError(f"the plan has {len(arrays)} arrays and no array index was given")
        array_index = arrays[0].index
    spec = next((a for a in arrays if a.index == array_index), None)
    if spec is None:
        raise ArrayError(f"array {array_index}: the plan has no such array")
    first = spec.first_task
    if not first <= task < first + spec.count:
        held = f"{spec.count} task(s)" if not first else \
            f"tasks {first}-{first + spec.count - 1}"
        raise ArrayError(f"array {array_index} has {held}, this is task {task}")
    return spec.first_shard + task - first


# A job id as records hold it: ``12`` or, for an array task, ``12_3`` (32-bit job ids,
# task ids below any MaxArraySize). Anything else read from a record is damage, never an
# argument for squeue, sacct or scancel (``--state=RUNNING`` would be an option there).
JOB_ID = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,7})?")


def is_job_id(text: str) -> bool:
    """True if ``text`` is a job id as records hold it (``12`` or ``12_3``)."""
    return JOB_ID.fullmatch(text) is not None


def task_job_id(array_job_id: str, task: int) -> str:
    """The id squeue, sacct and attempt records use for one array task: ``12_3``."""
    return f"{array_job_id}_{task}"


def array_job_id(job_id: str) -> str:
    """The array job id of ``12_3`` (``12``), or the id itself."""
    return job_and_task(job_id)[0]


def job_and_task(job_id: str) -> Tuple[str, Optional[int]]:
    """``12_3`` -> ``("12", 3)``; ``12`` -> ``("12", None)`` (check :func:`is_job_id` first:
    a task part that is not a number reads as no task)."""
    job, _, task = job_id.partition("_")
    return job, int(task) if task.isascii() and task.isdigit() else None
