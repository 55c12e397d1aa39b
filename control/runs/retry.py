"""Retry: attempt N+1 for shards that ended without a winner, as one held sparse array.

Selection reads only durable records, right after the status refresh that reconciles
them (see ``control.api``: an attempt whose job is gone from Slurm is recorded there, so
what status shows failed, retry retries):

* a shard is retried when it has no ``winner.json`` and its latest attempt is terminal and
  not ``succeeded`` (``failed`` or ``cancelled``; ``--auto`` takes ``failed`` only, and
  only while the latest attempt number is below the plan's ``max_attempts``);
* a shard named with ``--shard`` that has not ended or has a winner is refused, in the
  words status uses for it (a job still COMPLETING in Slurm: "retry in a few seconds");
* a shard whose records are damaged (``attempt.json`` unreadable, ``winner.json`` not a
  verified winner) is skipped and reported; the healthy shards are still retried;
* a ``created`` attempt that no submission names (a retry that crashed before ``sbatch``),
  or only a record that never got a job id (``_submitted_pairs``), is submitted as it
  is, not replaced.

Everything after the selection happens under ``retry.lock`` in the run directory (an
``flock``), and every write is idempotent: the attempt folder is created with ``mkdir``
(exclusive), the record is ``created`` before the submission record names it. So two
retries of the same run converge on one submission: the second one waits, then finds the
shards ``submitted`` and has nothing to do. Requeues (same attempt, next restart epoch)
never create attempts, so they never count against ``max_attempts``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.attempts import advance_attempt, load_attempt
from synthbatch.agent_stdlib.attempts import create_attempts as create_attempts_of
from synthbatch.agent_stdlib.contracts import AttemptRecord, Plan, SubmissionRecord
from synthbatch.agent_stdlib.layout import FIRST_ATTEMPT, RunLayout
from synthbatch.agent_stdlib.publish import load_winner
from synthbatch.agent_stdlib.resume import scan_kept
from synthbatch.agent_stdlib.statefile import StateError, ensure_dir
from synthbatch.control.errors import Conflict, InvalidInput, NotFound, SchedulerRejected
from synthbatch.control.runs.autoretry import LOCK_WAIT_S, RetryLock
from synthbatch.control.runs.status import index as settled
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.runs.status.reconcile import implied_first
from synthbatch.control.runs.status.records import (
    RECOVERY_GRACE_S,
    Expected,
    committed_at,
    expected_lookup,
    implied_view,
)
from synthbatch.control.runs.status.rows import ShardRow
from synthbatch.control.runs.store import attempt_numbers, load_plan, load_run, load_submissions

if TYPE_CHECKING:
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.slurm.scheduler import Scheduler

POLICIES = ("auto", "always", "never")
ABANDONED_AFTER_S = 120.0  # a created, unsubmitted attempt this old lost its submitter


@dataclass(frozen=True)
class Choice:
    """One shard to submit: its new attempt and where that attempt resumes from."""

    shard: int
    attempt: int
    previous: Optional[int]  # the latest attempt before this one
    resume_from: Optional[int] = None
    resume_records: int = 0  # complete records the resume source holds
    existing: bool = False  # a ``created`` attempt a crashed retry left unsubmitted

    def to_dict(self) -> Dict[str, object]:
        """Plain data for ``--json``."""
        return {"shard": self.shard, "attempt": self.attempt, "previous": self.previous,
                "resume_from": self.resume_from, "resume_records": self.resume_records}


@dataclass
class Selection:
    """What a retry would do: the choices, and why other shards are left alone."""

    choices: List[Choice] = field(default_factory=list)
    refused: Dict[int, str] = field(default_factory=dict)  # named shards that cannot be retried
    exhausted: Dict[int, str] = field(default_factory=dict)  # --auto: max_attempts reached
    skipped: Dict[int, str] = field(default_factory=dict)  # damaged records: not considered
    over_limit: Dict[int, str] = field(default_factory=dict)  # manual: past max_attempts


# shard -> its row as the status refresh before the lock saw it
Verdicts = Mapping[int, ShardRow]


def _not_over(shard: int, number: int, state: str, verdict: Optional[ShardRow]) -> str:
    """Why a named shard whose latest attempt has not ended is refused, in status's words."""
    shown, reason = (verdict.state, verdict.reason) if verdict else (state, None)
    if reason == norm.COMPLETING_REASON:
        return f"shard {shard}: {reason}; retry in a few seconds"
    return f"shard {shard} is {shown} (attempt {number})" + (f": {reason}" if reason else "")


def _submitted_pairs(records: Sequence[SubmissionRecord], now: float
                     ) -> Set[Tuple[int, int]]:
    """``(shard, attempt)`` named by a submission record that got a job id (or may still).

    A record without one, older than RECOVERY_GRACE_S, is a submit or retry that died
    before (or in) sbatch: status adopts its job by name after that grace, so when it
    still has none, no job exists and its ``created`` attempts are abandoned like any
    unsubmitted one (``_abandoned``): the next retry submits them.
    """
    pairs = set()
    for record in records:
        if record.job_id is not None or now - record.submitted_at < RECOVERY_GRACE_S:
            pairs.update((int(shard), attempt) for shard, attempt in record.attempts.items())
    return pairs


def resume_source(layout: RunLayout, plan: Plan, shard: int, attempts: Sequence[int],
                  policy: str) -> Tuple[Optional[int], int]:
    """``(attempt, records)`` the next attempt of ``shard`` resumes from, or ``(None, 0)``.

    ``auto`` trusts what the agent recorded (``partial_records`` of a terminal attempt);
    ``always`` also scans attempts whose agent recorded nothing (killed, lost) for complete
    records; ``never`` starts clean. The attempt holding the most records wins, the latest
    on a tie (a resumed attempt holds everything its source held, plus its own work).
    """
    if policy == "never":
        return None, 0
    spec = plan.shard(shard)
    best: Tuple[Optional[int], int] = (None, 0)
    for number in sorted(attempts):
        try:
            record = load_attempt(layout.attempt(shard, number).attempt_json)
        except StateError:
            record = None
        terminal = record is not None and record.state in states.TERMINAL
        kept = (record.partial_records or 0) if record is not None and terminal else 0
        if policy == "always" and not kept:
            output = layout.attempt(shard, number).output
            kept = len(scan_kept(output, spec.record_offset, spec.num_records))
        if kept and kept >= best[1]:
            best = (number, kept)
    return best


def _abandoned(layout: RunLayout, shard: int, number: int, record: Optional[AttemptRecord],
               now: float) -> bool:
    """True when an unsubmitted ``created`` attempt is old enough that no submit or retry
    can still be about to submit it (its writer crashed)."""
    try:
        written = record.updated_at if record else \
            layout.attempt(shard, number).root.stat().st_mtime
    except OSError:
        return False
    return now - written >= ABANDONED_AFTER_S


def _decide(layout: RunLayout, plan: Plan, shard: int, named: bool, policy: str, auto: bool,
            submitted: Set[Tuple[int, int]], selection: Selection, now: float,
            verdicts: Verdicts, expected: Optional[Expected]) -> None:
    """Add ``shard``'s choice (or the reason it has none) to ``selection``.

    ``expected``: what the submission records say of its newest attempt (a first attempt
    without a record yet is as its submission implies it)."""
    try:
        numbers = attempt_numbers(layout, shard, expected)
        winner = load_winner(layout, shard)
        latest = load_attempt(layout.attempt(shard, numbers[-1]).attempt_json) \
            if numbers else None
        if latest is None and expected is not None and expected.attempt == numbers[-1] \
                == FIRST_ATTEMPT:
            latest = implied_first(plan.run_id, shard, implied_view(expected))
    except (StateError, OSError) as err:
        # Damaged records: this shard cannot be judged (a damaged winner.json also blocks
        # every new attempt's winner); the others can.
        (selection.refused if named else selection.skipped)[shard] = f"shard {shard}: {err}"
        return
    if winner:
        if named:
            selection.refused[shard] = f"shard {shard} already has a winner"
        return
    if not numbers:
        selection.refused[shard] = f"shard {shard} has no attempt (was the run submitted?)"
        return
    number = numbers[-1]
    if (latest is None or latest.state == states.CREATED) and (shard, number) not in submitted:
        if not _abandoned(layout, shard, number, latest, now):
            if named:
                selection.refused[shard] = f"shard {shard}: attempt {number} is being submitted"
            return
        source = latest.resume_from if latest else None
        selection.choices.append(Choice(shard, number, numbers[-2] if len(numbers) > 1 else None,
                                        resume_from=source, existing=True))
        return
    state = latest.state if latest else "unrecorded"
    if state not in states.TERMINAL:
        verdict = verdicts.get(shard)
        if verdict is not None and verdict.attempt != number:
            # status judged an earlier attempt: another retry made this one since (while
            # this one waited for the lock), so it says nothing about it
            verdict = None
        if named:
            selection.refused[shard] = _not_over(shard, number, state, verdict)
        elif verdict is not None and verdict.state in norm.FINAL:  # status could not record it
            selection.skipped[shard] = (f"shard {shard}: status shows it {verdict.state} but "
                                        f"attempt {number} is still recorded {state}")
        return
    if state == states.SUCCEEDED:
        if named:
            selection.refused[shard] = (f"shard {shard}: attempt {number} succeeded and its "
                                        "winner is being completed (run status)")
        return
    if auto and state != states.FAILED:
        return
    if auto and number >= plan.max_attempts:
        selection.exhausted[shard] = (f"shard {shard}: {number} of {plan.max_attempts} "
                                      "attempts used")
        return
    if number >= plan.max_attempts:  # a manual retry may go past it, but says so
        selection.over_limit[shard] = (f"shard {shard}: attempt {number + 1} goes past "
                                       f"max_attempts = {plan.max_attempts} (a manual retry "
                                       "is not bounded by it)")
    source, kept = resume_source(layout, plan, shard, numbers, policy)
    selection.choices.append(Choice(shard, number + 1, number, source, kept))


def select(layout: RunLayout, plan: Plan, shards: Sequence[int] = (), policy: str = "auto",
           auto: bool = False, now: Optional[float] = None,
           verdicts: Optional[Verdicts] = None) -> Selection:
    """Which shards a retry submits and from where they resume (reads records only).

    ``verdicts`` (what the status refresh before it said) word the refusals of shards that
    have not ended; shards with damaged records are ``skipped``, the others still chosen.
    """
    if policy not in POLICIES:
        raise InvalidInput(f"--resume {policy!r}: expected one of {', '.join(POLICIES)}")
    unknown = sorted(s for s in shards if not 0 <= s < len(plan.shards))
    if unknown:
        raise NotFound(f"run {plan.run_id} has no shard {unknown[0]} "
                       f"({len(plan.shards)} shards)")
    named = bool(shards)
    now = time.time() if now is None else now
    records = load_submissions(layout)
    submitted = _submitted_pairs(records, now)
    expected = expected_lookup(records, plan.arrays, committed_at(layout))
    selection = Selection()
    for shard in sorted(set(shards)) if named else range(len(plan.shards)):
        _decide(layout, plan, shard, named, policy, auto, submitted, selection, now,
                verdicts or {}, expected(shard))
    return selection


def create_attempts(layout: RunLayout, run_id: str, choices: Sequence[Choice]) -> List[Choice]:
    """Write the ``created`` record of every new attempt; return the choices now on disk.

    ``mkdir`` is exclusive: a folder that already exists belongs to another writer, and
    its shard is left out (it is never overwritten). The records are written together,
    each atomically, with one sync for all (``attempts.create_attempts``).
    """
    ready, items = [], []
    for choice in choices:
        paths = layout.attempt(choice.shard, choice.attempt)
        if not choice.existing:
            ensure_dir(paths.root.parent)
            try:
                paths.root.mkdir(mode=0o700)
            except FileExistsError:
                continue
        else:  # a first attempt its submission implied (no folder until now), or one left
            ensure_dir(paths.root)
        if not choice.existing or not paths.attempt_json.exists():
            items.append((paths.attempt_json, run_id, choice.shard, choice.attempt,
                          choice.resume_from))
        ready.append(choice)
    create_attempts_of(items)
    return ready


def _abandon(layout: RunLayout, choices: Sequence[Choice], reason: str) -> None:
    """Mark attempts that Slurm definitely refused as ``failed`` (nothing will run them)."""
    for choice in choices:
        path = layout.attempt(choice.shard, choice.attempt).attempt_json
        current = load_attempt(path)
        if current is not None and current.state == states.CREATED:
            advance_attempt(path, states.FAILED, reason=reason)


@dataclass(frozen=True)
class RetryResult:
    """What one retry did (or, with ``dry_run``, would do)."""

    selection: Selection
    submitted: List[Choice]
    submissions: List[Dict[str, object]]


def retry_run(layout: RunLayout, profile: Profile, scheduler: Scheduler,
              shards: Sequence[int] = (), policy: Optional[str] = None, dry_run: bool = False,
              auto: bool = False, lock_wait_s: float = LOCK_WAIT_S,
              verdicts: Optional[Verdicts] = None,
              halted: Optional[Callable[[], Optional[str]]] = None) -> RetryResult:
    """Select, create attempt N+1, submit one held sparse array per plan array, release.

    Raises Conflict when a named shard cannot be retried (nothing is submitted then).
    Shards with damaged records are left out (``selection.skipped``); the rest go ahead.
    ``halted`` (the automatic rounds: ``autoretry.halted``) is asked under the lock: when
    it gives a reason, nothing is created or submitted.
    """
    from synthbatch.control.runs.submit.arrays import Staged, submit_all

    run = load_run(layout)
    if run is None:
        raise Conflict(f"run {layout.root.name} never committed (no run.json); nothing to retry")
    plan = load_plan(layout)
    policy = policy or plan.resume
    if dry_run:
        selection = select(layout, plan, shards, policy, auto, verdicts=verdicts)
        _refuse(selection)
        return RetryResult(selection, selection.choices, [])
    with RetryLock(layout, lock_wait_s):
        selection = select(layout, plan, shards, policy, auto, verdicts=verdicts)
        if halted is not None and halted():  # a cancel came first: it wins
            return RetryResult(selection, [], [])
        _refuse(selection)
        # A new attempt unsettles its shard: the settled index drops it first.
        with settled.changing(layout, plan.run_id, len(plan.shards),
                              [c.shard for c in selection.choices]):
            ready = create_attempts(layout, plan.run_id, selection.choices)
        if not ready:
            return RetryResult(selection, [], [])
        staged = Staged(layout, plan, run.plan_sha256, run.agent_pyz, run.agent_sha256)
        try:
            records = submit_all(staged, profile, scheduler,
                                 {c.shard: c.attempt for c in ready})
        except SchedulerRejected as err:
            _abandon(layout, ready, f"retry: sbatch was rejected: {err.message}")
            raise
    return RetryResult(selection, ready, [
        {"number": r.number, "job_id": r.job_id,
         "shards": sorted(int(s) for s in r.attempts)} for r in records])


def _refuse(selection: Selection) -> None:
    if selection.refused:
        reasons = [selection.refused[s] for s in sorted(selection.refused)]
        raise Conflict("; ".join(reasons), hint="retry takes shards whose latest attempt "
                                                "failed or was cancelled, without a winner")


def retry_reconciled(layout: RunLayout, profile: Profile, scheduler: Scheduler,
                     shards: Sequence[int] = (), resume: Optional[str] = None,
                     dry_run: bool = False, auto: bool = False,
                     lock_wait_s: float = LOCK_WAIT_S) -> Dict[str, object]:
    """``api.retry``: reconcile first (the same refresh as ``status``; the scheduler's
    error when it did not answer, as the records alone cannot say which shards ended),
    then ``retry_run`` with status's verdicts; what was (``dry_run``: would be) submitted
    as plain data."""
    from synthbatch.control.runs.status.refresh import observe, unreachable

    seen = observe(layout, scheduler)
    error = unreachable(seen)
    if error is not None:
        raise error
    verdicts = {row.index: row for row in map(ShardRow.from_dict, seen["shards"])}
    done = retry_run(layout, profile, scheduler, list(shards), resume, dry_run, auto,
                     lock_wait_s, verdicts=verdicts)
    selection = done.selection
    return {"run_id": layout.root.name, "dry_run": dry_run, "auto": auto,
            "shards": [c.to_dict() for c in done.submitted],
            "submissions": done.submissions,
            "exhausted": [selection.exhausted[s] for s in sorted(selection.exhausted)],
            "skipped": [selection.skipped[s] for s in sorted(selection.skipped)],
            "over_limit": [selection.over_limit[s] for s in sorted(selection.over_limit)]}
