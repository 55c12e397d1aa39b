"""Cancel: scancel only the jobs this run recorded, then converge the records.

Idempotent: shards with a winner or a terminal attempt are left alone, ids Slurm no longer
knows are fine, and a second call finds nothing left to do. A cancel Slurm did not answer
(an outage) stays pending in its record and is carried out by the next ``status``,
``wait`` or ``cancel`` that reaches Slurm (``carry_out_pending``). Attempts that never ran
(``created``) are cancelled at once; the others once Slurm confirms their job ended (no
agent can write them any more), unless the agent recorded its own outcome first.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.arrays import (
    Array,
    array_job_id,
    array_task,
    job_and_task,
    task_job_id,
)
from synthbatch.agent_stdlib.layout import RunLayout, job_name
from synthbatch.agent_stdlib.statefile import StateError
from synthbatch.control.errors import (
    Conflict,
    InvalidInput,
    SchedulerRejected,
    SchedulerUnavailable,
    SchedulerUncertain,
)
from synthbatch.control.runs import autoretry
from synthbatch.control.runs.status import index as settled
from synthbatch.control.runs.status.ledger import carried_out, pending_cancels, record_cancel
from synthbatch.control.runs.status.records import ShardView, load_plan_view, shard_scanner
from synthbatch.control.runs.status.verdict import UNKNOWN
from synthbatch.control.runs.status.watch import Backoff
from synthbatch.control.runs.store import load_submissions
from synthbatch.control.slurm.scheduler import Scheduler, left_queue, run_queue

BY_CANCEL = "cancelled by `synthbatch cancel`"


def select_shards(count: int, shards: Optional[Sequence[int]]) -> List[int]:
    """The shards to act on (all when ``shards`` is empty); InvalidInput names a bad one."""
    if not shards:
        return list(range(count))
    for index in shards:
        if not 0 <= index < count:
            raise InvalidInput(f"--shard {index}: the run has {count} shards (0-{count - 1})")
    return sorted(set(shards))


def _open(view: ShardView) -> bool:
    attempt = view.attempt
    return not view.winner and attempt is not None and attempt.state not in states.TERMINAL


def scancel_targets(layout: RunLayout, arrays: Sequence[Array],
                    job_ids: Set[str]) -> List[str]:
    """Task ids to scancel, folded into the array id where a whole submission goes."""
    targets: List[str] = []
    remaining = set(job_ids)
    for record in load_submissions(layout):
        if record.job_id is None or record.job_name is not None:
            continue  # a shared array holds other runs' tasks too: only ours, one by one
        tasks = {task_job_id(record.job_id, array_task(arrays, int(shard))[1])
                 for shard in record.attempts}
        if tasks and tasks <= remaining:
            targets.append(record.job_id)
            remaining -= tasks
    return sorted(targets) + sorted(remaining)


def _settle(layout: RunLayout, run_id: str, view: ShardView, reason: str) -> None:
    """Record ``cancelled`` unless the attempt reached a terminal state by itself (an
    attempt without a record yet, ``created``, gets its first record so)."""
    from synthbatch.control.runs.status.reconcile import mark_ended

    attempt = view.attempt
    assert attempt is not None
    # a failure is shown as it is; the record names the problem on the next read
    with contextlib.suppress(StateError, OSError):
        mark_ended(layout, view.index, attempt.number, states.CANCELLED, reason, run_id,
                   attempt)


def cancel_run(layout: RunLayout, scheduler: Scheduler, shards: Optional[Sequence[int]] = None,
               wait_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Dict[str, Any]:
    """Cancel the selected shards of a run; wait up to ``wait_s`` for Slurm to confirm."""
    plan = load_plan_view(layout)
    selected = select_shards(len(plan.shard_records), shards)
    with _rounds_stopped(layout, whole=not shards):
        scan = shard_scanner(layout, plan.arrays)
        views = [v for v in (scan(i) for i in selected) if _open(v)]
        settled.forget(layout, plan.run_id, len(plan.shard_records), [v.index for v in views])
        jobs = {v.attempt.job_id for v in views if v.attempt and v.attempt.job_id}
        targets = scancel_targets(layout, plan.arrays, jobs)
        if not shards:  # the whole run: its pending automatic round too (issue 34)
            targets += [j for j in autoretry.pending_job_ids(layout) if j not in targets]
        record = record_cancel(layout, selected, targets) if views else None
        try:
            scheduler.cancel(targets)
        except (SchedulerRejected, SchedulerUnavailable) as err:
            if record is not None and not isinstance(err, SchedulerUncertain):
                record.unlink(missing_ok=True)  # definitely nothing was cancelled
            raise
        if not shards:  # halted: a round job still in the queue submits nothing
            autoretry.clear_pending(layout)
    if record is not None:
        _carried(record)
    notes = carry_out_pending(layout, scheduler)  # an earlier cancel Slurm did not answer
    for view in views:
        if view.attempt and not view.attempt.job_id:
            _settle(layout, plan.run_id, view, f"{BY_CANCEL} before submission")
    shared = sorted({r.job_id for r in load_submissions(layout) if r.job_name and r.job_id}
                    & {array_job_id(j) for j in jobs}, key=int)
    ended = _wait(scheduler, job_name(plan.run_id), jobs, wait_s, clock, sleep, shared)
    for view in views:
        if view.attempt and view.attempt.job_id in ended:
            _settle(layout, plan.run_id, view, BY_CANCEL)
    scan = shard_scanner(layout, plan.arrays)  # the records, as the cancel left them
    after = [scan(i) for i in selected]
    return {"run_id": plan.run_id, "shards": selected, "scancelled": targets,
            "converged": ended >= jobs, "waiting_for": sorted(jobs - ended, key=_task_key),
            "states": {str(v.index): _state(v) for v in after}, "notes": notes}


@contextlib.contextmanager
def _rounds_stopped(layout: RunLayout, whole: bool) -> Iterator[None]:
    """Cancel of the whole run first stops the automatic rounds (``autoretry.halt``). The
    shards are then read under the retry lock: a round or retry that was submitting has
    finished, and its new attempts are cancelled with the rest; a round that comes later
    reads the halt under the same lock and submits nothing. A lock not had within its
    wait does not stop the cancel."""
    if whole:
        autoretry.halt(layout, f"the run was cancelled ({BY_CANCEL})")
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(Conflict):
            stack.enter_context(autoretry.RetryLock(layout))
        yield


def _carried(record: Path) -> None:
    # left pending on failure: the next status scancels the same ids again, which is harmless
    with contextlib.suppress(StateError, OSError):
        carried_out(record)


def carry_out_pending(layout: RunLayout, scheduler: Scheduler) -> List[str]:
    """scancel what earlier cancel requests asked for and Slurm never answered (a cancel
    during a slurmctld outage, exit 5); one note per request carried out. Called by
    ``status`` (so ``wait`` too) once squeue answered, and by ``cancel``. Stops at the
    first scancel that fails: the requests stay pending for the next caller."""
    notes = []
    for path, requested, job_ids in pending_cancels(layout):
        try:
            scheduler.cancel(job_ids)
        except (SchedulerRejected, SchedulerUnavailable):
            break
        _carried(path)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(requested))
        notes.append(f"the cancel requested at {when}, when Slurm could not be reached, "
                     f"was carried out now: scancel {' '.join(job_ids) or '(no jobs)'}")
    return notes


def _wait(scheduler: Scheduler, name: str, jobs: Set[str], wait_s: float,
          clock: Callable[[], float], sleep: Callable[[float], None],
          shared: Sequence[str] = ()) -> Set[str]:
    """Poll squeue (backing off) until every job ended or ``wait_s`` passed."""
    if not jobs:
        return set()
    deadline, backoff = clock() + wait_s, Backoff(base_s=1.0, cap_s=10.0)
    while True:
        ended = left_queue(run_queue(scheduler, name, shared)[1], jobs)
        if ended >= jobs or clock() >= deadline:
            return ended
        sleep(min(backoff.next(changed=False), max(deadline - clock(), 0.0)))


def _state(view: ShardView) -> str:
    if view.winner:
        return states.SUCCEEDED
    return view.attempt.state if view.attempt else UNKNOWN


def _task_key(job_id: str) -> tuple:
    job, task = job_and_task(job_id)
    return (int(job), -1 if task is None else task)
