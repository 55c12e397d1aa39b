"""Reconciliation of what an allocation agent left behind, for ``status`` to apply.

Two situations only the next reader can settle:

* **missing winner**: the agent recorded the attempt ``succeeded`` and died before
  ``winner.json``. :func:`complete_missing_winner` publishes it from the attempt's
  ``result.json`` after re-hashing every output file (first writer wins, so a racing
  requeued agent and ``status`` still yield one winner).
* **lost attempt**: the agent was killed (``kill -9``, node failure, OOM) and the job
  ended without a terminal record. :func:`lost_reason` decides from the attempt and the
  scheduler's row alone (pure); :func:`mark_lost` records the attempt ``failed``.

How ``status`` wires it (per shard, after the one batched squeue + sacct call)::

    records = load_shard(layout, index)
    done = reconcile_shard(layout, records.index, records.attempt, records.winner,
                           row, now=time.time())
    # use done.winner / done.attempt instead of the records read before, and
    # report done.note (one line) if it is not None

Nothing here calls the scheduler; ``row`` is the job's terminal accounting row when there
is one, else its queue row, else None (what ``observe._scheduler_view`` returns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from agent_stdlib import states
from agent_stdlib.attempts import advance_attempt, load_attempt
from agent_stdlib.contracts import AttemptRecord, WinnerRecord
from agent_stdlib.layout import RunLayout
from agent_stdlib.publish import complete_winner
from agent_stdlib.statefile import StateError
from control.runs.normalize import LOST_REASON
from control.slurm.parsers import JobRow

LOST_GRACE_S = 120.0  # a running attempt the scheduler does not know is lost after this
LOST_PREFIX = LOST_REASON


@dataclass(frozen=True)
class Reconciled:
    """One shard after reconciliation; ``note`` says what changed or why it could not."""

    winner: Optional[WinnerRecord]
    attempt: Optional[AttemptRecord]
    note: Optional[str] = None


def needs_winner(attempt: Optional[AttemptRecord], winner: Optional[WinnerRecord]) -> bool:
    """True when ``attempt`` succeeded but the shard has no winner (pure)."""
    return winner is None and attempt is not None and attempt.state == states.SUCCEEDED


def complete_missing_winner(layout: RunLayout, shard: int, attempt: int) -> WinnerRecord:
    """Publish ``winner.json`` of ``shard`` from its succeeded ``attempt``; return the winner.

    Idempotent (returns an existing winner unchanged). Raises StateError when the attempt
    is not ``succeeded`` or its ``result.json`` or files do not check out.
    """
    return complete_winner(layout, shard, attempt)


def lost_reason(attempt: AttemptRecord, row: Optional[JobRow], now: float,
                grace_s: float = LOST_GRACE_S) -> Optional[str]:
    """Why a ``running`` attempt's agent is gone for good, or None if it may be alive (pure).

    Lost when the scheduler reports the job terminal, or when neither squeue nor sacct
    knows the job ``grace_s`` after the attempt's last update. A queued or running job
    (including one requeued and pending again) is never lost.
    """
    if attempt.state != states.RUNNING:
        return None
    job = attempt.job_id or "?"
    if row is None:
        if now - attempt.updated_at <= grace_s:
            return None
        return (f"{LOST_PREFIX}job {job} is known to neither squeue nor sacct "
                f"{now - attempt.updated_at:.0f}s after the agent's last record")
    if not row.terminal:
        return None
    detail = f"exit {row.exit_code}" if row.exit_code is not None else "no exit code"
    if row.signal:
        detail += f", signal {row.signal}"
    return (f"{LOST_PREFIX}job {job} ended {row.state} ({detail}) while the attempt was "
            "running; the agent recorded no outcome")


def mark_lost(layout: RunLayout, shard: int, attempt: int, reason: str) -> AttemptRecord:
    """Record the attempt ``failed`` with ``reason`` unless it has meanwhile moved on."""
    return mark_ended(layout, shard, attempt, states.FAILED, reason)


def mark_ended(layout: RunLayout, shard: int, attempt: int, state: str,
               reason: str) -> AttemptRecord:
    """Record a ``running`` attempt whose agent is gone as ``state`` with ``reason``.

    Re-reads the attempt first: if the agent wrote a terminal record after the caller
    looked, that record is returned unchanged.
    """
    path = layout.attempt(shard, attempt).attempt_json
    current = load_attempt(path)
    if current is None:
        raise StateError(f"{path}: attempt record is missing")
    if current.state != states.RUNNING:
        return current
    try:
        return advance_attempt(path, state, reason=reason)
    except states.TransitionError:  # a concurrent writer finished it first
        latest = load_attempt(path)
        return latest if latest is not None else current


def reconcile_shard(layout: RunLayout, shard: int, attempt: Optional[AttemptRecord],
                    winner: Optional[WinnerRecord], row: Optional[JobRow], now: float,
                    grace_s: float = LOST_GRACE_S) -> Reconciled:
    """Apply both repairs to one shard; never raises for a bad record (see ``note``)."""
    if attempt is None:
        return Reconciled(winner, attempt)
    try:
        if needs_winner(attempt, winner):
            winner = complete_missing_winner(layout, shard, attempt.attempt)
            return Reconciled(winner, attempt, f"winner completed from attempt "
                                               f"{attempt.attempt}")
        if winner is not None:
            return Reconciled(winner, attempt)
        reason = lost_reason(attempt, row, now, grace_s)
        if reason is None:
            return Reconciled(winner, attempt)
        marked = mark_lost(layout, shard, attempt.attempt, reason)
        return Reconciled(winner, marked, reason if marked.reason == reason else None)
    except (StateError, OSError) as err:
        return Reconciled(winner, attempt, f"reconcile: {err}")
