"""Status: durable records + one squeue call (+ one sacct call when needed) -> shard states.

The scheduler is asked only about shards that are not settled (no winner and no terminal
attempt, or a failure/cancel recent enough that Slurm's reason is worth adding), with one
``squeue -t all -n <job name>`` for the whole run (which also shows jobs no record names);
``sacct`` only for jobs squeue no longer knows or shows ended.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress
from operator import add, attrgetter, itemgetter
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.arrays import array_job_id
from synthbatch.agent_stdlib.layout import RunLayout, job_name
from synthbatch.agent_stdlib.statefile import StateError
from synthbatch.control.errors import MAX_REASON, SchedulerUnavailable, one_line
from synthbatch.control.runs.cachestats import add_cache
from synthbatch.control.runs.status import index as settled
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.runs.status.ledger import LAG_GRACE_S, cancel_requested, expired_missing
from synthbatch.control.runs.status.records import (
    Expected,
    PlanView,
    ShardView,
    SubmissionView,
    committed_at,
    damaged_beside_winner,
    expected_lookup,
    load_plan_view,
    needs_recovery,
    plan_view_data,
    plan_view_from_data,
    run_job_ids,
    scan_shard,
    shard_folders,
    submission_views,
    submissions_key,
)
from synthbatch.control.runs.status.rows import ShardRow, shard_row
from synthbatch.control.runs.status.totals import Usage
from synthbatch.control.slurm.parsers import JobRow, index_rows
from synthbatch.control.slurm.scheduler import Scheduler, left_queue, run_queue

ENRICH_WINDOW_S = 600.0  # ask Slurm why a shard failed or was cancelled this recently
FRESH_PROGRESS_S = 60.0  # progress older than this does not count towards the rate
NOT_SUCCEEDED = re.compile(f"[^{settled.STATE_CODES[norm.SUCCEEDED]}]")  # in the index's codes


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
    # squeue answered, sacct failed: (message, hint); see ``accounting_down``
    accounting_error: Optional[Tuple[str, Optional[str]]] = None
    usage: Optional[Usage] = None  # the run's GPU usage, asked in the same sacct call


def needs_scheduler(view: ShardView, now: float) -> bool:
    """True when Slurm's evidence can change what status says about this shard."""
    attempt = view.attempt
    if view.winner or view.winner_problem or view.problem or attempt is None \
            or not attempt.job_id:
        return False
    if attempt.state not in states.TERMINAL:
        return True
    recent = now - attempt.updated_at < ENRICH_WINDOW_S
    return attempt.state in (norm.FAILED, norm.CANCELLED) and recent


def ask_scheduler(scheduler: Scheduler, name: str, job_ids: Set[str],
                  shared: Sequence[str] = (),
                  usage_ids: Optional[List[str]] = None) -> SchedulerView:
    """One squeue call for every job called ``name`` (and one for the ``shared`` arrays the
    run's tasks are in, which have names of their own); one sacct call for ``job_ids``
    that squeue no longer knows or shows ended (sacct adds exit codes and who cancelled).
    ``rows`` keeps only the first call's rows: recovery reads them as the run's own jobs.
    With ``usage_ids`` (the run's job ids) that one sacct call also answers ``totals``'s
    GPU usage (``usage``): one sacct call per refresh."""
    view = SchedulerView()
    try:
        view.rows, view.queue = run_queue(scheduler, name, shared)
    except SchedulerUnavailable as err:
        view.error = one_line(err.message, 300)
        view.hint = err.hint
        return view
    absent = left_queue(view.queue, job_ids)
    # both: states and the run's usage in one call (without ``absent``, ``totals`` asks)
    both = bool(absent) and usage_ids is not None and hasattr(scheduler, "accounting_usage")
    if absent:
        state_ids = sorted({array_job_id(j) for j in absent}, key=int)
        try:
            if both:
                answer = scheduler.accounting_usage(state_ids, usage_ids or [])
                rows = None if answer is None else answer[0]
                view.usage = Usage(usage_ids or [], None if answer is None else answer[1])
            else:
                rows = scheduler.accounting(state_ids)
        except SchedulerUnavailable as err:
            # slurmctld answered, accounting did not (slurmdbd down): squeue's rows stand;
            # only the jobs squeue no longer lists are not asked (``accounting_down``)
            view.asked = {j for j in job_ids if j in view.queue}
            view.accounting_error = (one_line(err.message, 300), err.hint)
            if both:
                view.usage = Usage(usage_ids or [], None, err)
            return view
        view.accounting = rows is not None
        # Only for the jobs sacct was asked about: just after a cancel, slurmdbd may
        # still hold the whole array as one range record (``12_[0-2%2] CANCELLED``),
        # which must not override squeue's rows of sibling tasks that are running.
        view.acct = {job: row for job, row in index_rows(rows or []).items()
                     if job in absent}
    view.asked = set(job_ids)
    return view


def accounting_down(sched: SchedulerView, verdicts: List[norm.Verdict], notes: List[str]
                    ) -> None:
    """squeue answered but sacct did not: an error only when a shard is left unknown for
    it (a job squeue no longer lists); else a note, every verdict stands on squeue's rows
    and the records."""
    if sched.accounting_error is None:
        return
    message, hint = sched.accounting_error
    if any(v.reason == norm.SCHEDULER_UNAVAILABLE for v in verdicts):
        sched.error, sched.hint = message, hint
    else:
        notes.append(f"accounting unavailable ({message}"
                     + (f"; {hint}" if hint else "")
                     + "): shards were judged by squeue and their records")


def _evidence(shard: ShardView, sched: SchedulerView, lost: Set[str],
              cancels: Set[int], now: float) -> norm.Evidence:
    attempt = shard.attempt
    if attempt is None:
        return norm.Evidence(winner=shard.winner, winner_problem=shard.winner_problem,
                             attempt_reason=shard.problem)
    job = attempt.job_id or ""
    # Slurm's rows count only where they can change the verdict (``needs_scheduler``): a
    # settled shard's verdict is its records' alone, whether or not this refresh happened
    # to ask squeue about its run (the settled index keeps exactly that verdict).
    asks = needs_scheduler(shard, now)
    return norm.Evidence(
        winner=shard.winner, winner_problem=shard.winner_problem,
        attempt_state=attempt.state, attempt_reason=attempt.reason,
        queue=sched.queue.get(job) if asks else None,
        acct=sched.acct.get(job) if asks else None,
        asked=job in sched.asked or attempt.state in states.TERMINAL,
        accounting=sched.accounting is not False, lag_expired=job in lost,
        cancel_requested=shard.index in cancels)


def settles(view: ShardView, now: float) -> bool:
    """True when only a ``retry`` can change what status says about this shard.

    A verified winner, or a ``failed``/``cancelled`` attempt Slurm no longer has anything
    to add to, read without any problem in its records: such a shard's row goes to the
    settled index and is not read again.
    """
    attempt = view.attempt
    if view.problem or view.winner_problem or view.progress_problem or attempt is None \
            or attempt.state not in states.TERMINAL:
        return False
    if view.winner:
        return True
    return attempt.state in (norm.FAILED, norm.CANCELLED) and not needs_scheduler(view, now)


def _plan(layout: RunLayout, index: settled.Index
          ) -> Tuple[PlanView, Optional[Tuple[settled.Identity, Dict[str, Any]]]]:
    """The plan's shape: the settled index's copy when ``plan.json`` is the file it was
    taken from (same device, inode, size, mtime and ctime), else read; and the copy to
    keep when it was read."""
    ident = settled.identity(layout.plan_json)
    if ident is not None and index.plan is not None and index.plan_identity == ident:
        try:
            return plan_view_from_data(index.plan), None
        except ValueError:
            pass
    plan = load_plan_view(layout)
    return plan, ((ident, plan_view_data(plan)) if ident is not None else None)


@dataclass
class Refresh:
    """One status refresh before it is shown: the summary, the rows read this time, and
    the settled index's rows, which are made dicts (``data``) or printed as the JSON text
    the index keeps (``json_text``) only when asked for."""

    summary: Dict[str, Any]  # everything ``status --json`` prints but ``shards``
    count: int
    index: settled.Index
    known: Mapping[int, int]  # shard -> position of its row in the index
    fresh: List[ShardRow]  # the rows read this refresh, in shard order
    ended_at: Optional[float] = None  # latest update of any shard's attempt (None: none)
    job_ids: Optional[List[str]] = None  # ``run_job_ids`` of the submissions (None: unknown)
    usage: Optional[Usage] = None  # GPU usage of ``job_ids`` if this refresh asked sacct
    plan: Optional[PlanView] = None  # the plan's shape (the settled index's copy if it holds)
    # the submission records read this refresh (None: not read, or damaged): ``totals``
    # takes them rather than parse them again (a 100,000-shard record is ~1.6 MiB)
    submissions: Optional[List[SubmissionView]] = None

    def rows(self) -> List[ShardRow]:
        """Every shard's row, in shard order."""
        if not self.known:
            return self.fresh
        if not self.fresh:
            return self.index.rows([self.known[i] for i in range(self.count)])
        read = {row.index: row for row in self.fresh}
        return [read[i] if i in read else self.index.row(self.known[i])
                for i in range(self.count)]

    def column(self, name: str) -> List[Any]:
        """Every shard's ``name`` field (a ShardRow field), in shard order."""
        if not self.known:
            return [getattr(row, name) for row in self.fresh]
        values = self.index.column(name)
        read = {row.index: getattr(row, name) for row in self.fresh}
        return [read[i] if i in read else values[self.known[i]] for i in range(self.count)]

    def data(self) -> Dict[str, Any]:
        """The status as plain data (``observe``)."""
        return {**self.summary, "shards": [row.to_dict() for row in self.rows()]}

    def json_bytes(self) -> bytes:
        """``json.dumps(self.data(), sort_keys=True)`` as UTF-8, with the settled rows as
        the index keeps their text: when every shard is settled, the index's block of
        rows as it was read (no row decoded, split, built or encoded: 100,000 rows)."""
        marker = os.urandom(16).hex()  # stands for the rows; no status text can guess it
        head = json.dumps({**self.summary, "shards": marker}, sort_keys=True).encode("utf-8")
        if not self.fresh and self.known and self.index.whole(self.count):
            rows = self.index.block()
        else:
            texts, known = (self.index.texts if self.known else []), self.known
            read = {row.index: row for row in self.fresh}
            if isinstance(known, settled.Span):  # shard i at position i: no lookup a row
                parts = texts[:known.count] + [json.dumps(read[i].to_dict(), sort_keys=True)
                                               for i in range(known.count, self.count)]
            else:
                parts = [texts[known[i]] if i in known else
                         json.dumps(read[i].to_dict(), sort_keys=True)
                         for i in range(self.count)]
            rows = ", ".join(parts).encode("utf-8")
        before, _, after = head.partition(f'"{marker}"'.encode("ascii"))
        return b"".join((before, b"[", rows, b"]", after))

    def json_text(self) -> str:
        """``json_bytes`` as text."""
        return self.json_bytes().decode("utf-8")


def submissions_summary(layout: RunLayout, index: settled.Index
                        ) -> Tuple[Optional[List[str]], Optional[Dict[str, Any]]]:
    """The run's job ids (``run_job_ids``: what ``totals`` counts) for a refresh that
    reads no submission record, and the summary to keep in the settled index when it has
    none for these records (else None); (None, None) when they cannot be read.

    The index's summary is used when its key (``submissions_key``: every record's
    identity) is the folder's now; otherwise the records are read and a new summary kept
    only if the key did not change while they were read (a concurrent submit or retry:
    a later refresh keeps it).
    """
    key = submissions_key(layout)
    if key is None:
        return None, None
    kept = index.submissions
    if kept is not None and kept.get("key") == key:
        return list(kept["job_ids"]), None
    try:
        job_ids = run_job_ids(submission_views(layout))
    except (StateError, OSError):
        return None, None
    if submissions_key(layout) != key:
        return job_ids, None
    return job_ids, {"key": key, "job_ids": job_ids}


def _submissions(layout: RunLayout) -> Tuple[List[SubmissionView], List[str]]:
    """The submission records, and a note when one is damaged: then none is used (each
    shard is read by listing its folders, and no crashed submit is recovered)."""
    try:
        return submission_views(layout), []
    except (StateError, OSError) as err:
        return [], [f"{one_line(str(err), 300)}: every shard is read by listing its folders"]


def observe(layout: RunLayout, scheduler: Scheduler, now: Optional[float] = None,
            lag_grace_s: float = LAG_GRACE_S, use_index: bool = True) -> Dict[str, Any]:
    """The full status of a run as plain data (what ``status --json`` prints).

    Shards the settled index holds are not read (``use_index=False`` reads every shard,
    as a from-scratch refresh does, and leaves the index alone).
    """
    return refresh(layout, scheduler, now, lag_grace_s, use_index).data()


def refresh(layout: RunLayout, scheduler: Scheduler, now: Optional[float] = None,
            lag_grace_s: float = LAG_GRACE_S, use_index: bool = True,
            with_usage: bool = False) -> Refresh:
    """One refresh (``observe`` without making the settled rows dicts); ``with_usage``:
    the one sacct call also asks the run's GPU usage (``Refresh.usage``, for ``totals``)."""
    now = time.time() if now is None else now
    index = settled.load(layout, expand=False) if use_index else settled.Index()
    plan, plan_copy = _plan(layout, index)
    count = len(plan.shard_records)
    index = settled.check(layout, index, plan.run_id, count)
    if not index.whole(count):  # rows are needed by shard: decode them
        index = settled.expanded(layout, index)
    commit_time = committed_at(layout)
    committed = commit_time is not None
    known = index.positions()
    todo = [i for i in range(count) if i not in known] if len(known) < count else []
    # With every shard settled and the run committed no submission can need recovery (a
    # submission without its job id or release names attempts that are not settled), and
    # no shard needs its expected attempt: the (large) submission records are not read.
    submissions, damaged = _submissions(layout) if todo or not committed else ([], [])
    job_ids, summary_copy = (None if damaged else run_job_ids(submissions)), None
    if not todo and committed and use_index:  # read from the index's summary if it holds
        job_ids, summary_copy = submissions_summary(layout, index)
    # damaged submission records imply nothing (they may name submitted attempts); one
    # listing of shards/ says which shards have a folder (an lstat each otherwise)
    folders = shard_folders(layout) if todo else None
    expected = expected_lookup(submissions, plan.arrays, None if damaged else commit_time,
                               folders)
    shards = [scan_shard(layout, i, expected(i)) for i in todo]
    wanted = {s.attempt.job_id for s in shards if needs_scheduler(s, now) and s.attempt
              and s.attempt.job_id}
    recover = needs_recovery(submissions, committed, now)
    shared = {s.job_id for s in submissions if s.job_name and s.job_id}
    sched = ask_scheduler(scheduler, job_name(plan.run_id), wanted,
                          sorted(shared & {array_job_id(j) for j in wanted}, key=int),
                          job_ids if with_usage else None) \
        if wanted or recover else SchedulerView()
    notes: List[str] = list(damaged)
    if index.problem:
        notes.append(f"settled index not used ({one_line(index.problem, 300)}): every "
                     "shard was read from its records and the index rebuilt")
    if recover and sched.rows is not None:
        done = recover_crashed(layout, scheduler, committed, sched.rows, now)
        notes.extend(done)
        if done:  # a job id adopted changes what the records imply
            submissions, damaged = _submissions(layout)
            expected = expected_lookup(submissions, plan.arrays,
                                       None if damaged else commit_time)
            shards = _rescan(layout, shards, expected)
    if sched.rows is not None and any(v.attempt and v.attempt.state in SCHEDULED
                                      for v in shards):
        from synthbatch.control.runs.cancel import (
            carry_out_pending,  # a cancel Slurm did not answer
        )

        notes.extend(carry_out_pending(layout, scheduler))
    verdicts = _verdicts(layout, shards, sched, now, lag_grace_s)
    if _reconcile(layout, plan.run_id, shards, verdicts, sched):
        shards = _rescan(layout, shards, expected)
        verdicts = _verdicts(layout, shards, sched, now, lag_grace_s)
    accounting_down(sched, verdicts, notes)
    notes.extend(one_line(note) for note in damaged_beside_winner(shards))
    verdicts = full_disk(layout, verdicts)
    fresh = [shard_row(layout, s, plan.shard_records[s.index], v)
             for s, v in zip(shards, verdicts)]
    if use_index:
        settling = [(s, row) for s, row in zip(shards, fresh) if settles(s, now)]
        if todo and committed and not damaged and len(settling) == len(todo):
            # the index will hold every shard: keep the summary the next refresh needs
            job_ids, summary_copy = submissions_summary(layout, index)
        settled.add(layout, index, [row for _, row in settling], plan.run_id, count,
                    plan_copy, max((s.attempt.updated_at for s, _ in settling if s.attempt),
                                   default=0.0), summary_copy)
    rate = sum((s.progress.rate for s, row in zip(shards, fresh) if row.state == norm.RUNNING
                and s.progress is not None
                and now - s.progress.updated_at <= FRESH_PROGRESS_S), 0.0)
    summary = summarize(plan.run_id, plan.name, plan.total_records, committed, fresh, rate,
                        sched, notes, _tally_index(index, known))
    ended = max((s.attempt.updated_at for s in shards if s.attempt), default=0.0)
    if known:
        ended = max(ended, index.ended_at)
    read = submissions if (todo or not committed) and not damaged else None
    return Refresh(summary, count, index, known, fresh, ended or None, job_ids, sched.usage,
                   plan, read)


def recover_crashed(layout: RunLayout, scheduler: Scheduler, committed: bool,
                    rows: List[JobRow], now: float) -> List[str]:
    """Finish the submissions a crash interrupted: the run's own (``rows``: its jobs by
    name) and those of arrays it shares with other runs (for their whole group)."""
    from synthbatch.control.runs.shared import recover_shared
    from synthbatch.control.runs.submit import arrays as submit  # rare: a submit crashed

    records = submit.load_submissions(layout)
    notes = submit.recover_submissions(layout, scheduler, committed,
                                       [r for r in records if r.job_name is None], rows, now)
    for record in records:
        if record.job_name is not None and (record.job_id is None or not record.released):
            notes += recover_shared(layout, scheduler, record, now)
    return notes


def _rescan(layout: RunLayout, shards: List[ShardView],
            expected: Callable[[int], Optional[Expected]]) -> List[ShardView]:
    """The shards read again after this refresh wrote to them: what the listing of
    ``shards/`` said is stale (a record written makes its shard's folder), so each
    folder is looked up again."""
    def fresh(shard: int) -> Optional[Expected]:
        hint = expected(shard)
        return hint._replace(folder=None) if hint is not None else None

    return [scan_shard(layout, s.index, fresh(s.index)) for s in shards]


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


def _reconcile(layout: RunLayout, run_id: str, shards: List[ShardView],
               verdicts: List[norm.Verdict], sched: SchedulerView) -> List[int]:
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
                from synthbatch.agent_stdlib.publish import complete_winner  # only with work

                complete_winner(layout, shard.index, attempt.number)
            elif attempt.state in SCHEDULED and verdict.source != "attempt" \
                    and verdict.state in norm.RECORDED and gone(sched, attempt.job_id):
                from synthbatch.control.runs.status import reconcile

                state, prefix = norm.RECORDED[verdict.state]
                reconcile.mark_ended(layout, shard.index, attempt.number, state,
                                     f"{prefix}{verdict.reason}", run_id, attempt)
            else:
                continue
        except (StateError, OSError):
            continue  # shown as it is; the record names the problem on the next read
        changed.append(shard.index)
    return changed


FULL_BELOW = 1 << 20  # bytes free under which the run's filesystem is called full


def full_disk(layout: RunLayout, verdicts: List[norm.Verdict]) -> List[norm.Verdict]:
    """Jobs that ended without their agent's outcome, said to have ended on a full
    filesystem when the run's is full now (the agent could not write its outcome there:
    on the testbed it then exits 120, Python failing to flush its output)."""
    def recorded_here(v: norm.Verdict) -> bool:  # status decided it: the job left no outcome
        return bool(v.reason and v.reason.endswith(norm.NO_OUTCOME) and v.source != "attempt")

    if not any(map(recorded_here, verdicts)):
        return verdicts
    try:
        fs = os.statvfs(layout.root)
    except OSError:
        return verdicts
    free = fs.f_bavail * fs.f_frsize
    if free >= FULL_BELOW:
        return verdicts
    note = f"; the run's filesystem is full ({free} bytes free under {layout.root})"
    return [norm.Verdict(v.state, one_line(v.reason + note, MAX_REASON), v.source)
            if recorded_here(v) else v for v in verdicts]


def _verdicts(layout: RunLayout, shards: List[ShardView], sched: SchedulerView, now: float,
              lag_grace_s: float) -> List[norm.Verdict]:
    missing = {s.attempt.job_id for s in shards if s.attempt and s.attempt.job_id in sched.asked
               and s.attempt.state not in states.TERMINAL
               and s.attempt.job_id not in sched.queue and s.attempt.job_id not in sched.acct}
    lost = expired_missing(layout, missing, sched.asked - missing, now, lag_grace_s) \
        if sched.asked else set()
    cancels = cancel_requested(layout)
    # A winner decides alone (rule 1): no Evidence to build for most shards of a large run.
    return [norm.WINNER if s.winner else norm.normalize(_evidence(s, sched, lost, cancels, now))
            for s in shards]


def unreachable(data: Dict[str, Any]) -> Optional[SchedulerUnavailable]:
    """The error of a refresh that could not ask Slurm about a run that is not over.

    ``status`` exits with it (5) and ``retry`` refuses to act on it; a run whose every shard
    is settled by its records needs no scheduler, so an error then is only a note.
    """
    if not data.get("scheduler_error") or data.get("state") in norm.FINAL:
        return None
    return SchedulerUnavailable(data["scheduler_error"], hint=data.get("scheduler_hint"))


_STATE, _DONE, _TOKENS = attrgetter("state"), attrgetter("records_done"), attrgetter("tokens")
_RECORD_FAILURES, _DROPPED = attrgetter("record_failures"), attrgetter("records_dropped")


class Tally(NamedTuple):
    """What ``summarize`` counts over rows: states, records done, tokens, failed shards,
    records the clients gave up on, records they dropped."""

    counts: Counter
    done: int
    tokens: int
    failures: List[Dict[str, Any]]  # in shard order
    record_failures: int
    dropped: int


def _failure(row: ShardRow) -> Optional[Dict[str, Any]]:
    """The failure entry of a row, or None. A shard that is unknown only because Slurm
    could not be asked is not a failure: the one ``scheduler_error`` says so for all."""
    state, reason = row.state, row.reason
    if (state != norm.CANCELLED and reason != norm.SCHEDULER_UNAVAILABLE) or \
            (state == norm.CANCELLED and reason):
        return {"shard": row.index, "state": state, "reason": reason, "log": row.log}
    return None


def tally(rows: List[ShardRow]) -> Tally:
    """The Tally of ``rows`` in C-level passes (100,000 rows: ~15 ms, not ~100)."""
    states = list(map(_STATE, rows))
    maybe = compress(rows, map(norm.MAYBE_FAILED.__contains__, states))
    failures = [f for f in map(_failure, maybe) if f]
    return Tally(Counter(states), sum(map(_DONE, rows)), sum(map(_TOKENS, rows)), failures,
                 sum(map(_RECORD_FAILURES, rows)), sum(map(_DROPPED, rows)))


def _tally_index(index: settled.Index, known: Mapping[int, int]) -> Optional[Tally]:
    """The Tally of the settled rows status uses, from the index's header (its codes and
    sums; the rows that did not succeed read for the failures) when every row is used,
    else from its rows."""
    if not known:
        return None
    codes = index.codes
    if len(known) == len(codes):  # no pending shard: every row used
        counts = Counter({settled.CODE_STATES[c]: codes.count(c) for c in set(codes)})
        odd = [m.start() for m in NOT_SUCCEEDED.finditer(codes)] \
            if counts.get(norm.SUCCEEDED, 0) != len(codes) else []
        rows = [index.brief(p) for p in odd] if index.whole(len(codes)) else index.rows(odd)
        sums = index.sums
        return Tally(counts, sums["records_done"], sums["tokens"],
                     [f for f in map(_failure, rows) if f], sums["record_failures"],
                     sums["records_dropped"])
    return tally(index.rows(sorted(known.values())))


def alias_totals(rows: List[ShardRow]) -> Dict[str, Dict[str, Any]]:
    """Per model alias, the running shards' generator figures added up (concurrency is
    the sum of every running client's current limit)."""
    totals: Dict[str, Dict[str, Any]] = {}
    for row in rows:
        for alias, figures in (row.aliases or {}).items():
            total = totals.setdefault(alias, {"shards": 0, "errors": {}})
            total["shards"] += 1
            for key, value in figures.items():
                if key == "errors":
                    for kind, count in value.items():
                        total["errors"][kind] = total["errors"].get(kind, 0) + count
                elif key == "cache":
                    total["cache"] = add_cache(total.get("cache"), value)
                else:
                    total[key] = total.get(key, 0) + value
    return dict(sorted(totals.items()))


def summarize(run_id: str, name: str, total: int, committed: bool,
              rows: List[ShardRow], rate: float, sched: SchedulerView,
              notes: List[str], settled_rows: Optional[Tally] = None) -> Dict[str, Any]:
    """Counts, totals, rate and ETA around the per-shard rows (and the settled rows the
    index holds, which ``rows`` then leaves out)."""
    counted = tally(rows)
    if settled_rows is not None:  # every field adds up; the failures stay in shard order
        counted = Tally(*map(add, counted, settled_rows))
        counted = counted._replace(failures=sorted(counted.failures, key=itemgetter("shard")))
    counts, done = dict(counted.counts), counted.done
    state = norm.run_state(counts, committed)
    eta = (total - done) / rate if rate > 0 and state not in norm.FINAL else None
    return {
        "run_id": run_id, "name": name, "committed": committed, "state": state,
        "records": total, "records_done": done,
        "records_dropped": counted.dropped, "tokens": counted.tokens,
        "aliases": alias_totals(rows),  # running shards only: none is settled
        "record_failures": counted.record_failures,
        "rate": round(rate, 3), "eta_s": round(eta, 1) if eta is not None else None,
        "counts": dict(sorted(counts.items())), "accounting": sched.accounting,
        "scheduler_error": sched.error, "scheduler_hint": sched.hint, "notes": notes,
        "failures": counted.failures,
    }
