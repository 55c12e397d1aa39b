"""Status: durable records + one squeue call (+ one sacct call when needed) -> shard states.

The scheduler is asked only about shards that are not settled (no winner and no terminal
attempt, or a failure/cancel recent enough that Slurm's reason is worth adding), with one
``squeue -t all -n <job name>`` for the whole run (which also shows jobs no record names);
``sacct`` only for jobs squeue no longer knows or shows ended.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from agent_stdlib import states
from agent_stdlib.arrays import array_job_id
from agent_stdlib.layout import RunLayout, job_name
from agent_stdlib.statefile import StateError
from control.errors import SchedulerUnavailable, one_line
from control.runs import normalize as norm
from control.runs.ledger import LAG_GRACE_S, cancel_requested, expired_missing
from control.runs.store import (
    ShardView,
    SubmissionView,
    expected_attempts,
    load_plan_view,
    needs_recovery,
    scan_shard,
    submission_views,
)
from control.slurm.parsers import JobRow, index_rows
from control.slurm.scheduler import Scheduler

ENRICH_WINDOW_S = 600.0  # ask Slurm why a shard failed or was cancelled this recently
FRESH_PROGRESS_S = 60.0  # progress older than this does not count towards the rate
LOG_IN_REASON = re.compile(r"\(log (/[^\s:)]+)")


@dataclass
class SchedulerView:
    """What Slurm said in one refresh, indexed by job id (``12`` or ``12_3``)."""

    queue: Dict[str, JobRow] = field(default_factory=dict)
    acct: Dict[str, JobRow] = field(default_factory=dict)
    accounting: Optional[bool] = None  # None: sacct was not needed
    error: Optional[str] = None
    hint: Optional[str] = None  # what to check when ``error`` says Slurm is unreachable
    asked: Set[str] = field(default_factory=set)
    rows: Optional[List[JobRow]] = None  # squeue's rows for the run's job name


def needs_scheduler(view: ShardView, now: float) -> bool:
    """True when Slurm's evidence can change what status says about this shard."""
    attempt = view.attempt
    if view.winner or view.winner_problem or view.problem or attempt is None \
            or not attempt.job_id:
        return False
    if attempt.state not in norm.ATTEMPT_TERMINAL:
        return True
    recent = now - attempt.updated_at < ENRICH_WINDOW_S
    return attempt.state in (norm.FAILED, norm.CANCELLED) and recent


def ask_scheduler(scheduler: Scheduler, name: str, job_ids: Set[str]) -> SchedulerView:
    """One squeue call for every job called ``name``; one sacct call for ``job_ids`` that
    squeue no longer knows or shows ended (sacct adds exit codes and who cancelled)."""
    view = SchedulerView()
    try:
        view.rows = scheduler.queue(name=name)
        view.queue = index_rows(view.rows)
        absent = {j for j in job_ids if j not in view.queue or view.queue[j].terminal}
        if absent:
            rows = scheduler.accounting(sorted({array_job_id(j) for j in absent}, key=int))
            view.accounting = rows is not None
            # Only for the jobs sacct was asked about: just after a cancel, slurmdbd may
            # still hold the whole array as one range record (``12_[0-2%2] CANCELLED``),
            # which must not override squeue's rows of sibling tasks that are running.
            view.acct = {job: row for job, row in index_rows(rows or []).items()
                         if job in absent}
    except SchedulerUnavailable as err:
        view.error = one_line(err.message, 300)
        view.hint = err.hint
        return view
    view.asked = set(job_ids)
    return view


def _evidence(shard: ShardView, sched: SchedulerView, lost: Set[str],
              cancels: Set[int]) -> norm.Evidence:
    attempt = shard.attempt
    if attempt is None:
        return norm.Evidence(winner=shard.winner, winner_problem=shard.winner_problem,
                             attempt_reason=shard.problem)
    job = attempt.job_id or ""
    return norm.Evidence(
        winner=shard.winner, winner_problem=shard.winner_problem,
        attempt_state=attempt.state, attempt_reason=attempt.reason,
        queue=sched.queue.get(job), acct=sched.acct.get(job),
        asked=job in sched.asked or attempt.state in norm.ATTEMPT_TERMINAL,
        accounting=sched.accounting is not False, lag_expired=job in lost,
        cancel_requested=shard.index in cancels)


def log_path(layout: RunLayout, shard: ShardView, reason: Optional[str]) -> Optional[str]:
    """The log a failure points at: the one named in the reason, else Slurm's output."""
    match = LOG_IN_REASON.search(reason or "")
    if match:
        return match.group(1)
    job = shard.attempt.job_id if shard.attempt else None
    if job:
        path = layout.slurm_logs / f"slurm-{job}.out"
        if path.exists():
            return str(path)
    return None


def _shard_row(layout: RunLayout, shard: ShardView, size: int,
               verdict: norm.Verdict) -> Dict[str, Any]:
    attempt, progress = shard.attempt, shard.progress
    done = size if verdict.state == norm.SUCCEEDED else (progress.records_done if progress
                                                           else 0)
    reason = verdict.reason
    if reason is None and verdict.state not in norm.FINAL and shard.progress_problem:
        reason = one_line(shard.progress_problem, 300)  # advisory: only shown, never decides
    row: Dict[str, Any] = {
        "index": shard.index, "state": verdict.state, "reason": reason,
        "attempt": attempt.number if attempt else None,
        "job_id": attempt.job_id if attempt else None,
        "records": size, "records_done": min(done, size),
        "tokens": progress.tokens if progress else 0,
        "record_failures": progress.failures if progress else 0,
    }
    if verdict.state in (norm.FAILED, norm.CANCELLED, norm.LOST, norm.UNKNOWN):
        row["log"] = log_path(layout, shard, verdict.reason)
    return row


def _rate(shards: List[ShardView], rows: List[Dict[str, Any]], now: float) -> float:
    rate = 0.0
    for shard, row in zip(shards, rows):
        if row["state"] == norm.RUNNING and shard.progress is not None and \
                now - shard.progress.updated_at <= FRESH_PROGRESS_S:
            rate += shard.progress.rate
    return rate


def _submissions(layout: RunLayout) -> Tuple[List[SubmissionView], List[str]]:
    """The submission records, and a note when one is damaged: then none is used (each
    shard is read by listing its folders, and no crashed submit is recovered)."""
    try:
        return submission_views(layout), []
    except (StateError, OSError) as err:
        return [], [f"{one_line(str(err), 300)}: every shard is read by listing its folders"]


def _scan(layout: RunLayout, count: int) -> List[ShardView]:
    """Every shard, each read at the attempt the submission records name (no listing)."""
    expected = expected_attempts(_submissions(layout)[0]).get
    return [scan_shard(layout, index, expected(index)) for index in range(count)]


def observe(layout: RunLayout, scheduler: Scheduler, now: Optional[float] = None,
            lag_grace_s: float = LAG_GRACE_S) -> Dict[str, Any]:
    """The full status of a run as plain data (what ``status --json`` prints)."""
    now = time.time() if now is None else now
    plan = load_plan_view(layout)
    committed = layout.run_json.exists()
    submissions, damaged = _submissions(layout)
    expected = expected_attempts(submissions).get
    shards = [scan_shard(layout, index, expected(index))
              for index in range(len(plan.shard_records))]
    wanted = {s.attempt.job_id for s in shards if needs_scheduler(s, now) and s.attempt
              and s.attempt.job_id}
    recover = needs_recovery(submissions, committed, now)
    sched = ask_scheduler(scheduler, job_name(plan.run_id), wanted) \
        if wanted or recover else SchedulerView()
    notes: List[str] = list(damaged)
    if recover and sched.rows is not None:
        from control.runs import submit  # rare: a submit crashed; needs the full records

        notes = submit.recover_submissions(layout, scheduler, committed,
                                           submit.load_submissions(layout), sched.rows, now)
        shards = _scan(layout, len(plan.shard_records)) if notes else shards
    verdicts = _verdicts(layout, shards, sched, now, lag_grace_s)
    if _reconcile(layout, shards, verdicts, sched):
        shards = _scan(layout, len(plan.shard_records))
        verdicts = _verdicts(layout, shards, sched, now, lag_grace_s)
    rows = [_shard_row(layout, s, plan.shard_records[s.index], v)
            for s, v in zip(shards, verdicts)]
    return summarize(plan.run_id, plan.name, plan.total_records, committed, rows,
                     _rate(shards, rows, now), sched, notes)


# Scheduler verdicts on a scheduled attempt whose job is gone -> what gets persisted.
ENDED = {norm.LOST: (states.FAILED, norm.LOST_REASON),
         norm.FAILED: (states.FAILED, ""),
         norm.CANCELLED: (states.CANCELLED, "")}
SCHEDULED = frozenset({states.SUBMITTED, states.PENDING, states.RUNNING})


def gone(sched: SchedulerView, job_id: Optional[str]) -> bool:
    """True when no process of the job can still write its attempt's records.

    squeue's row is terminal, or squeue no longer lists the job at all (sacct has it
    terminal, or it is lost). A job with processes left is listed as COMPLETING (or
    another active state) however sacct already calls it: sacct says CANCELLED or FAILED
    while the processes are still in KillWait, and the agent may be recording its own
    outcome then.
    """
    if not job_id or job_id not in sched.asked:
        return False
    row = sched.queue.get(job_id)
    return row is None or row.terminal


def _reconcile(layout: RunLayout, shards: List[ShardView], verdicts: List[norm.Verdict],
               sched: SchedulerView) -> List[int]:
    """Repair what durable state proves: a missing winner, an attempt whose job is gone.

    A scheduled attempt whose job ended (or was lost) without an outcome from its agent is
    recorded at once, as soon as ``gone`` says no process of it is left, and its readiness
    is closed out: status and retry then read the same verdict. The only writes status
    makes to shard records; returns the shards it changed.
    """
    changed = []
    for shard, verdict in zip(shards, verdicts):
        attempt = shard.attempt
        if attempt is None or shard.winner:
            continue
        try:
            if attempt.state == states.SUCCEEDED:
                from control.runs import reconcile  # imported only when there is work

                reconcile.complete_missing_winner(layout, shard.index, attempt.number)
            elif attempt.state in SCHEDULED and verdict.source != "attempt" \
                    and verdict.state in ENDED and gone(sched, attempt.job_id):
                from control.runs import reconcile

                state, prefix = ENDED[verdict.state]
                reconcile.mark_ended(layout, shard.index, attempt.number, state,
                                     f"{prefix}{verdict.reason}")
            else:
                continue
        except (StateError, OSError):
            continue  # shown as it is; the record names the problem on the next read
        changed.append(shard.index)
    return changed


def _verdicts(layout: RunLayout, shards: List[ShardView], sched: SchedulerView, now: float,
              lag_grace_s: float) -> List[norm.Verdict]:
    missing = {s.attempt.job_id for s in shards if s.attempt and s.attempt.job_id in sched.asked
               and s.attempt.state not in norm.ATTEMPT_TERMINAL
               and s.attempt.job_id not in sched.queue and s.attempt.job_id not in sched.acct}
    lost = expired_missing(layout, missing, sched.asked - missing, now, lag_grace_s) \
        if sched.asked else set()
    cancels = cancel_requested(layout)
    # A winner decides alone (rule 1): no Evidence to build for most shards of a large run.
    return [norm.WINNER if s.winner else norm.normalize(_evidence(s, sched, lost, cancels))
            for s in shards]


def unreachable(data: Dict[str, Any]) -> Optional[SchedulerUnavailable]:
    """The error of a refresh that could not ask Slurm about a run that is not over.

    ``status`` exits with it (5) and ``retry`` refuses to act on it; a run whose every shard
    is settled by its records needs no scheduler, so an error then is only a note.
    """
    if not data.get("scheduler_error") or data.get("state") in norm.FINAL:
        return None
    return SchedulerUnavailable(data["scheduler_error"], hint=data.get("scheduler_hint"))


def summarize(run_id: str, name: str, total: int, committed: bool,
              rows: List[Dict[str, Any]], rate: float, sched: SchedulerView,
              notes: List[str]) -> Dict[str, Any]:
    """Counts, totals, rate and ETA around the per-shard rows."""
    counts: Dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    done = sum(row["records_done"] for row in rows)
    state = norm.run_state(counts, committed)
    eta = (total - done) / rate if rate > 0 and state not in norm.FINAL else None
    # A shard that is unknown only because Slurm could not be asked is not a failure: the
    # one ``scheduler_error`` says so for all of them.
    failures = [{"shard": r["index"], "state": r["state"], "reason": r["reason"],
                 "log": r.get("log")}
                for r in rows if (r["state"] in (norm.FAILED, norm.LOST, norm.UNKNOWN)
                                  and r["reason"] != norm.SCHEDULER_UNAVAILABLE)
                or (r["state"] == norm.CANCELLED and r["reason"])]
    return {
        "run_id": run_id, "name": name, "committed": committed, "state": state,
        "records": total, "records_done": done,
        "tokens": sum(row["tokens"] for row in rows),
        "record_failures": sum(row.get("record_failures", 0) for row in rows),
        "rate": round(rate, 3), "eta_s": round(eta, 1) if eta is not None else None,
        "counts": dict(sorted(counts.items())), "accounting": sched.accounting,
        "scheduler_error": sched.error, "scheduler_hint": sched.hint, "notes": notes,
        "failures": failures, "shards": rows,
    }
