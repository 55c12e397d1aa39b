"""Which pending local tasks start now, and on which GPUs (pure).

One rule for every supervisor of a workspace, so that each computes the same answer from
the same table: pending tasks of released jobs whose supervisor runs are taken in order
of (job id, task id), first come first served, without backfill (once one task has to
wait for resources, every later one waits too: ``Priority``). A task starts when

* its job's array throttle (``%N``) leaves room (else ``JobArrayTaskLimit``; the next
  tasks are still considered),
* fewer tasks of the whole workspace run than its job's ``max_concurrent``, and
* enough of its job's GPU pool is free (else ``Resources``).

A task holds its GPUs while its process runs (``live``), however its record reads.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Set, Tuple

from synthbatch.control.backends.local.jobs import PENDING, Job

Key = Tuple[str, int]  # (job id, task)
LIMIT, RESOURCES, PRIORITY = "JobArrayTaskLimit", "Resources", "Priority"


def plan_starts(jobs: Sequence[Job], eligible: Set[str],
                live: Set[Key]) -> Tuple[Dict[Key, Tuple[str, ...]], Dict[Key, str]]:
    """``(starts, waits)``: task -> the GPUs it starts on; task -> why it waits.

    ``jobs`` are the workspace's active jobs, ``eligible`` the ids of those whose pending
    tasks may start (released, supervisor running), ``live`` the tasks whose process runs.
    """
    used: Set[str] = set()
    per_job: Dict[str, int] = {}
    for job in jobs:
        for task in job.tasks.values():
            if (job.job_id, task.task) in live:
                used.update(task.gpus)
                per_job[job.job_id] = per_job.get(job.job_id, 0) + 1
    running = sum(per_job.values())
    starts: Dict[Key, Tuple[str, ...]] = {}
    waits: Dict[Key, str] = {}
    blocked = False
    for job in sorted((j for j in jobs if j.job_id in eligible), key=lambda j: int(j.job_id)):
        for task in sorted(job.tasks.values(), key=lambda t: t.task):
            key = (job.job_id, task.task)
            if task.state != PENDING or key in live:
                continue
            if job.throttle and per_job.get(job.job_id, 0) >= job.throttle:
                waits[key] = LIMIT
                continue
            free: List[str] = [g for g in job.pool if g not in used]
            if blocked or running >= job.max_concurrent or len(free) < job.gpus:
                waits[key] = PRIORITY if blocked else RESOURCES
                blocked = True
                continue
            starts[key] = tuple(free[:job.gpus])
            used.update(starts[key])
            per_job[job.job_id] = per_job.get(job.job_id, 0) + 1
            running += 1
    return starts, waits
