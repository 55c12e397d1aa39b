"""A run's numbers: elapsed time, average records/s and tokens/s, GPU-hours used.

While the run goes on: the time since submit, the averages and GPU-hours so far (the
current rate is status's ``rate``). Averages are over the time the run was in progress
(``active_s``: the idle time between a failure and its retry is left out). Once it is
over they stop: elapsed runs until its last shard was recorded, and GPU-hours come from
Slurm accounting: every execution of every job of the
run (requeues and retries included, ``sacct -D``), ``ElapsedRaw`` x the ``gres/gpu`` of
``AllocTRES``. Without accounting (or while Slurm cannot be asked) ``gpu_hours`` is None
and ``gpu_hours_from`` says why. The numbers of a finished run are kept in
``<run>/totals.json`` once accounting has a row for every shard's job, so later ``status``
calls ask Slurm nothing; a retry (new job ids) makes them be counted again. When the
status refresh asks sacct for states, the same call brings the usage (``Usage``): one
sacct call per refresh.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from synthbatch.agent_stdlib.arrays import task_job_id
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import (
    StateError,
    read_json,
    read_json_or_none,
    write_json_atomic,
)
from synthbatch.agent_stdlib.states import TERMINAL
from synthbatch.control.errors import SchedulerUnavailable
from synthbatch.control.runs.status.records import (
    SubmissionView,
    run_job_ids,
    shard_scanner,
    submission_views,
)
from synthbatch.control.runs.status.verdict import FINAL
from synthbatch.control.runs.store import last_moment
from synthbatch.control.slurm.parsers import JobUsage, ParseError, split_job_id
from synthbatch.control.slurm.scheduler import Scheduler


def ended_at(layout: RunLayout, shards: int) -> Optional[float]:
    """When the last shard's latest attempt was recorded (None if none was)."""
    scan = shard_scanner(layout, ())  # job ids are not needed: ``updated_at`` is
    times = [view.attempt.updated_at for view in (scan(i) for i in range(shards))
             if view.attempt]
    return max(times) if times else None


@dataclass(frozen=True)
class Usage:
    """What the refresh's one sacct call said the jobs ``ids`` used (``rows`` None: the
    cluster keeps no accounting; ``error``: sacct failed), so ``totals`` asks no more."""

    ids: Sequence[str]
    rows: Optional[List[JobUsage]]
    error: Optional[SchedulerUnavailable] = None

    def of(self, job_ids: Sequence[str]) -> Optional[List[JobUsage]]:
        """The rows of ``job_ids`` (the call also asked whole arrays for states: a task
        of an array shared with another run is counted only if the run's own)."""
        if self.error is not None:
            raise self.error
        if self.rows is None:
            return None
        wanted = set(job_ids)
        return [row for row, (job, tasks) in _row_jobs(self.rows)
                if job in wanted or any(task in wanted for task in tasks or ())]


def _row_jobs(rows: List[JobUsage]) -> List[Tuple[JobUsage, Tuple[str, Optional[List[str]]]]]:
    """Each accounting row with its job and its array tasks' job ids (None: not an array
    row); a row whose job id cannot be read is left out."""
    found = []
    for row in rows:
        try:
            job, tasks = split_job_id(row.job_id)
        except ParseError:
            continue
        found.append((row, (job, None if tasks is None else [task_job_id(job, t) for t in tasks])))
    return found


def gpu_hours(scheduler: Scheduler, job_ids: List[str],
              shard_jobs: List[str], known: Optional[Usage] = None,
              used: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``{"gpu_hours", "gpu_hours_from", "complete"}`` from accounting (``known``: what the
    refresh's sacct call already said, used when it asked every one of ``job_ids``).

    ``complete``: accounting has a row for every job in ``shard_jobs`` (each shard's latest
    job; rows can lag a job's end by a few seconds). ``used``, when given, gets the rows
    (``rows``, None: no accounting) for the cost figures (``cost``).
    """
    try:
        rows = known.of(job_ids) if known is not None and set(job_ids) <= set(known.ids) \
            else scheduler.usage(job_ids)
    except SchedulerUnavailable as err:
        return {"gpu_hours": None, "gpu_hours_from": f"Slurm could not be asked: "
                                                      f"{err.message}", "complete": False}
    if used is not None:
        used["rows"] = rows
    if rows is None:
        return {"gpu_hours": None, "gpu_hours_from": "no accounting on this cluster",
                "complete": True}
    seen = set()
    for _, (job, tasks) in _row_jobs(rows):
        seen.update([job] if tasks is None else tasks)
    used = sum(row.elapsed_s * row.gpus for row in rows) / 3600.0
    return {"gpu_hours": round(used, 4), "gpu_hours_from": scheduler.USAGE_FROM,
            "complete": all(job in seen for job in shard_jobs)}


def active_seconds(layout: RunLayout, submissions: Sequence[SubmissionView],
                   end: float) -> Optional[float]:
    """How long the run was in progress up to ``end``: the union over its submissions of
    [submitted, the last record of that submission's attempts] (an attempt not over yet
    counts until ``end``), so the idle time between a failure and its retry is left out.
    None with one submission (then it is the whole elapsed time)."""
    if len(submissions) < 2:
        return None
    windows: List[Tuple[float, float]] = []
    for sub in submissions:
        stop = sub.submitted_at
        for shard, attempt in sub.attempts.items():
            try:
                record = read_json(layout.attempt_json_path(int(shard), attempt))
            except (StateError, OSError, ValueError):
                continue  # damaged or unreadable: status names it; nothing to count here
            state = record.get("state") if record else None
            updated = record.get("updated_at") if record else None
            if state is not None and state not in TERMINAL:
                stop = end
            elif isinstance(updated, (int, float)) and not isinstance(updated, bool):
                stop = max(stop, float(updated))
        windows.append((sub.submitted_at, min(stop, end)))
    total, reach = 0.0, float("-inf")
    for start, stop in sorted(windows):
        start = max(start, reach)
        if stop > start:
            total, reach = total + stop - start, stop
    return total


def totals(layout: RunLayout, data: Dict[str, Any], scheduler: Scheduler,
           now: Optional[float] = None,
           jobs: Optional[Callable[[], List[Optional[str]]]] = None,
           ended: Optional[float] = None,
           job_ids: Optional[List[str]] = None,
           usage: Optional[Usage] = None,
           used: Optional[Dict[str, Any]] = None,
           submissions: Optional[Sequence[SubmissionView]] = None) -> Dict[str, Any]:
    """The run's numbers for ``status`` (``data`` is its refresh).

    ``jobs`` gives each shard's job id in shard order when ``data`` leaves the rows out
    (called only for a finished run not yet counted); ``ended``, when given, is when the
    last shard was recorded, else it is read from every shard's attempt; ``job_ids``,
    when given, are ``run_job_ids`` of the submission records (else they are read);
    ``usage``, when given, is what the refresh's sacct call said (no second call).
    While the run goes on, the numbers so far: GPU-hours of the executions until now
    (never kept). ``used``, when given, gets accounting's rows (``rows``) and whether
    they are a finished run's whole count (``complete``), when this call asked for them.
    ``submissions``, when given, are the refresh's submission views (else they are read).
    """
    now = time.time() if now is None else now
    known = usage
    created = created_at(layout)
    if created is None:
        return {}
    final = data.get("state") in FINAL
    done, tokens = data.get("records_done", 0), data.get("tokens", 0)
    if job_ids is None:
        job_ids = run_job_ids(submission_views(layout))
    end, shard_jobs = now, []
    if final:
        cached = _cached(layout, job_ids)
        if cached is not None:
            return cached
        per_shard = jobs() if jobs is not None else [row.get("job_id")
                                                     for row in data.get("shards", [])]
        end = last_moment((ended if ended is not None else ended_at(layout, len(per_shard)))
                          or now, now)
        shard_jobs = [job for job in per_shard if job]
    usage = gpu_hours(scheduler, job_ids, shard_jobs, known, used)
    found = {**_numbers(layout, created, end, done, tokens, submissions),
             "gpu_hours": usage["gpu_hours"], "gpu_hours_from": usage["gpu_hours_from"]}
    if not final:
        return found
    if used is not None:
        used["complete"] = usage["complete"]
    if usage["complete"]:
        try:
            write_json_atomic(layout.totals_json, {"schema_version": 1, "job_ids": job_ids,
                                                    "totals": found})
        except OSError:
            pass  # a read-only run directory: counted again next time
    return found


def _numbers(layout: RunLayout, created: float, end: float, done: int,
             tokens: int, submissions: Optional[Sequence[SubmissionView]] = None
             ) -> Dict[str, Any]:
    """Elapsed since submit, the time the run was in progress (``active_s``: without the
    idle time before a retry) and the averages over that time."""
    elapsed = max(0.0, end - created)
    try:
        active = active_seconds(layout, submission_views(layout) if submissions is None
                                else submissions, end)
    except StateError:  # a damaged submission record: status names it
        active = None
    active = elapsed if active is None else min(elapsed, active)
    return {"elapsed_s": round(elapsed, 1), "active_s": round(active, 1),
            "records_per_s": round(done / active, 3) if active > 0 else None,
            "tokens_per_s": round(tokens / active, 1) if active > 0 else None}


def created_at(layout: RunLayout) -> Optional[float]:
    """``run.json``'s ``created_at`` (None: not committed, or damaged). Read as plain JSON:
    the contract classes cost ~11 ms of a fresh ``status`` process to import."""
    value = (read_json_or_none(layout.run_json) or {}).get("created_at")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _cached(layout: RunLayout, job_ids: List[str]) -> Optional[Dict[str, Any]]:
    try:
        kept = read_json(layout.totals_json)
    except (StateError, OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("job_ids") != job_ids or \
            not isinstance(kept.get("totals"), dict):
        return None
    return kept["totals"]
