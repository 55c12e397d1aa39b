"""The one table from durable records + scheduler evidence to a shard's state (pure).

Precedence, first match wins:

1. a verified ``winner.json``                      -> succeeded (the durable truth)
   a damaged one (symlink, garbage, other shard)   -> unknown (never succeeded)
2. no readable attempt record                      -> unknown
3. squeue and sacct both terminal and different    -> EvidenceConflict (names both)
4. attempt record terminal                         -> that state (Slurm's word added to
   the reason); failed/cancelled vs. a COMPLETED job -> EvidenceConflict (unless status
   recorded the failure itself: the job ended without an outcome)
5. attempt ``created`` (no job)                    -> created
6. terminal accounting or a terminal queue row     -> cancelled / failed (accounting beats
   a stale queue row: RUNNING in squeue + COMPLETED in sacct is over)
7. an active row                                   -> pending / running / cancelling
   (COMPLETING: running, its processes are still being stopped)
8. no row anywhere: scheduler not asked            -> unknown (scheduler unavailable)
                    before the persisted deadline  -> unknown (accounting lag)
                    after it                       -> lost
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple

from synthbatch.agent_stdlib.states import (
    CANCELLED,
    CREATED,
    FAILED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
)
from synthbatch.control.errors import MAX_REASON, EvidenceConflict, one_line
from synthbatch.control.slurm.parsers import ACTIVE_STATES, JobRow

# A shard's states: the attempt words (agent_stdlib.states, next to their edge table) plus
# the three only status derives.
CANCELLING, UNKNOWN, LOST = "cancelling", "unknown", "lost"
LOST_REASON = "lost: "  # reason prefix of attempts status recorded as lost
NO_OUTCOME = "before the agent recorded an outcome"  # in the reason of failures status recorded
COMPLETING_REASON = "its job is still completing in Slurm (COMPLETING)"
SHARD_STATES = (CREATED, PENDING, RUNNING, CANCELLING, SUCCEEDED, FAILED, CANCELLED,
                UNKNOWN, LOST)
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, LOST})


class Report(NamedTuple):
    """How a shard state is reported everywhere it shows: its glyph on status's grid, its
    colour on a terminal (None: plain), its one-letter code in the settled index (final
    states only), whether it is a failure (it fails the run, ``wait`` counts it, an
    automatic round retries it), and what status records on the attempt when it decides
    this state for a job that left Slurm without an outcome (attempt state, reason prefix)."""

    glyph: str
    colour: Optional[str] = None
    code: Optional[str] = None
    failure: bool = False
    recorded: Optional[Tuple[str, str]] = None


# The one table of how each state is reported: a change to how a lost job (one that left
# Slurm without an outcome) is reported is a change to its line here and to ``_missing``.
REPORT = {
    SUCCEEDED: Report("#", "green", "s"),
    RUNNING: Report(">", "cyan"),
    CANCELLING: Report("x", "yellow"),
    PENDING: Report(".", "yellow"),
    CREATED: Report(" "),
    FAILED: Report("F", "red", "f", failure=True, recorded=(FAILED, "")),
    CANCELLED: Report("C", "magenta", "c", recorded=(CANCELLED, "")),
    LOST: Report("L", "red", "l", failure=True, recorded=(FAILED, LOST_REASON)),
    UNKNOWN: Report("?", "yellow"),
}
FAILING = frozenset(state for state, report in REPORT.items() if report.failure)
# rows that name a log and may be a failure entry (status's ``_failure`` decides)
MAYBE_FAILED = FAILING | {CANCELLED, UNKNOWN}
# what status records on the attempt of a job gone without an outcome, by verdict
RECORDED = {state: report.recorded for state, report in REPORT.items() if report.recorded}
RUNNING_ROWS = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT",
                          "RESIZING", "SUSPENDED", "STOPPED", "UPDATE_DB"})
FAILURE_TEXT = {
    "FAILED": "job failed",
    "TIMEOUT": "job hit its time limit (TIMEOUT)",
    "NODE_FAIL": "a node of the job failed (NODE_FAIL)",
    "OUT_OF_MEMORY": "job ran out of memory (OUT_OF_MEMORY)",
    "PREEMPTED": "job was preempted (PREEMPTED)",
    "BOOT_FAIL": "nodes failed to boot (BOOT_FAIL)",
    "DEADLINE": "job missed its deadline (DEADLINE)",
    "COMPLETED": "job completed",
}
LAG = "accounting lag"
SCHEDULER_UNAVAILABLE = "scheduler unavailable"  # reason of a shard Slurm was not asked about


@dataclass(frozen=True)
class Evidence:
    """Everything known about one shard's latest attempt."""

    winner: bool = False
    winner_problem: Optional[str] = None  # winner.json is there but not a verified winner
    attempt_state: Optional[str] = None  # None: no readable attempt record
    attempt_reason: Optional[str] = None
    queue: Optional[JobRow] = None  # the squeue row covering the job, if any
    acct: Optional[JobRow] = None  # the sacct row of the job, if any
    asked: bool = True  # the scheduler answered this refresh
    accounting: bool = True  # the cluster keeps accounting (sacct works)
    lag_expired: bool = False  # missing from squeue and sacct past the persisted deadline
    cancel_requested: bool = False  # `synthbatch cancel` asked for this shard


@dataclass(frozen=True)
class Verdict:
    """A shard's state, a one-line reason and which evidence decided it."""

    state: str
    reason: Optional[str]
    source: str  # winner | attempt | sacct | squeue | conflict | none


def describe_row(row: JobRow, source: str) -> str:
    """``sacct says CANCELLED by 0 (exit 0:15)`` — one row, for reasons and conflicts."""
    text = f"{source} says {row.state}" + (f" {row.reason}" if row.reason else "")
    if row.exit_code is not None:
        text += f" (exit {row.exit_code}:{row.signal or 0})"
    return text


def _terminal_row(ev: Evidence) -> Optional[tuple[JobRow, str]]:
    queue = ev.queue if ev.queue is not None and ev.queue.terminal else None
    acct = ev.acct if ev.acct is not None and ev.acct.terminal else None
    if queue and acct and queue.state != acct.state:
        raise EvidenceConflict(f"conflicting terminal evidence: {describe_row(queue, 'squeue')}"
                               f", {describe_row(acct, 'sacct')}")
    if acct:
        return acct, "sacct"
    return (queue, "squeue") if queue else None


def _cancelled(row: JobRow, ev: Evidence) -> str:
    """``job cancelled by uid 0 outside synthbatch``: who (Slurm's reason) and from where."""
    who = f" {row.reason.replace('by ', 'by uid ')}" if row.reason else ""
    origin = "by `synthbatch cancel`" if ev.cancel_requested else "outside synthbatch"
    return f"job cancelled{who} {origin}"


def _ended(row: JobRow, source: str, ev: Evidence) -> Verdict:
    """A job that ended without the agent recording an outcome."""
    if row.state in ("CANCELLED", "REVOKED"):
        return Verdict(CANCELLED, _cancelled(row, ev), source)
    text = FAILURE_TEXT.get(row.state, f"job ended {row.state}")
    if row.exit_code is not None and (row.exit_code or row.signal):
        text += f" (exit {row.exit_code}" + (f", signal {row.signal})" if row.signal else ")")
    elif row.reason and source == "squeue":
        text += f" ({row.reason})"
    return Verdict(FAILED, f"{text} {NO_OUTCOME}", source)


def _from_attempt(ev: Evidence, ended: Optional[tuple[JobRow, str]]) -> Verdict:
    state, reason = ev.attempt_state or UNKNOWN, ev.attempt_reason
    if state == FAILED and (reason or "").startswith(LOST_REASON):
        state = LOST  # persisted by status when the agent vanished without an outcome
    if ended is None:
        return Verdict(state, reason, "attempt")
    row, source = ended
    if state in (FAILED, CANCELLED) and row.state == "COMPLETED" and not row.exit_code \
            and NO_OUTCOME not in (reason or ""):  # status recorded that job as failed
        raise EvidenceConflict(f"conflicting terminal evidence: attempt record says {state}, "
                               f"{describe_row(row, source)}")
    if state == CANCELLED and row.state == "CANCELLED" and row.reason \
            and "synthbatch cancel" not in (reason or "") \
            and not (reason or "").startswith("job cancelled"):  # persisted by status
        extra = _cancelled(row, ev)
        reason = f"{extra}; agent: {reason}" if reason else extra
    return Verdict(state, reason, "attempt")


def _active(row: JobRow, source: str, ev: Evidence) -> Verdict:
    if ev.cancel_requested:
        return Verdict(CANCELLING, f"cancel requested; {source} says {row.state}", source)
    if row.state in RUNNING_ROWS:
        reason = {"RUNNING": None, "COMPLETING": COMPLETING_REASON}.get(
            row.state, f"{source} says {row.state}")
        return Verdict(RUNNING, reason, source)
    return Verdict(PENDING, row.reason or f"{source} says {row.state}", source)


def _missing(ev: Evidence) -> Verdict:
    if not ev.asked:
        return Verdict(UNKNOWN, SCHEDULER_UNAVAILABLE, "none")
    where = "squeue and sacct" if ev.accounting else "squeue (no accounting on this cluster)"
    if ev.lag_expired:
        return Verdict(LOST, f"job is in neither {where} and the agent recorded no outcome",
                       "none")
    return Verdict(UNKNOWN, f"{LAG}: job not in {where} yet", "none")


WINNER = Verdict(SUCCEEDED, None, "winner")  # rule 1, whatever else is known


def decide(ev: Evidence) -> Verdict:
    """The shard's state from its evidence; EvidenceConflict when terminal evidence clashes."""
    if ev.winner:
        return WINNER
    if ev.winner_problem:
        return Verdict(UNKNOWN, ev.winner_problem, "winner")
    if ev.attempt_state is None:
        return Verdict(UNKNOWN, ev.attempt_reason or "no attempt record", "none")
    ended = _terminal_row(ev)
    if ev.attempt_state in TERMINAL:
        return _from_attempt(ev, ended)
    if ev.attempt_state == CREATED:
        return Verdict(CREATED, ev.attempt_reason or "not submitted", "attempt")
    if ended is not None:
        return _ended(ended[0], ended[1], ev)
    for row, source in ((ev.queue, "squeue"), (ev.acct, "sacct")):
        if row is not None and row.state in ACTIVE_STATES:
            return _active(row, source, ev)
        if row is not None:
            return Verdict(UNKNOWN, f"{source} reports state {row.state!r}, not understood",
                           source)
    return _missing(ev)


def normalize(ev: Evidence) -> Verdict:
    """``decide`` for status: a conflict becomes ``unknown`` with the conflict as reason."""
    try:
        verdict = decide(ev)
    except EvidenceConflict as err:
        return Verdict(UNKNOWN, one_line(err.message, MAX_REASON), "conflict")
    if verdict.reason:
        return Verdict(verdict.state, one_line(verdict.reason, MAX_REASON), verdict.source)
    return verdict


def run_state(counts: dict, committed: bool = True) -> str:
    """The run's state from its shard counts (state -> number).

    ``succeeded`` / ``failed`` / ``cancelled`` once every shard is final (failed wins over
    cancelled), ``running`` while any shard is not (the counts say pending, unknown, ...).
    """
    seen = {state for state, n in counts.items() if n}
    if not committed:
        return "uncommitted"
    if not seen or not seen <= FINAL:
        return RUNNING
    if seen == {SUCCEEDED}:
        return SUCCEEDED
    return FAILED if seen & FAILING else CANCELLED
