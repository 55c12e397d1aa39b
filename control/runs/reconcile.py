"""Reconciliation of what an allocation agent left behind, for ``status`` to apply.

Two situations only the next reader can settle:

* **missing winner**: the agent recorded the attempt ``succeeded`` and died before
  ``winner.json``. :func:`complete_missing_winner` publishes it from the attempt's
  ``result.json`` after re-hashing every output file (first writer wins, so a racing
  requeued agent and ``status`` still yield one winner).
* **agent gone**: the agent was killed (``kill -9``, node failure, OOM) and its job left
  Slurm without a terminal record. :func:`mark_ended` records the outcome and closes the
  readiness out.

What counts as "gone" and which outcome is recorded is decided in one place,
``control.runs.status`` (``gone`` and the normalisation table), after its one batched
squeue + sacct call; ``cancel`` settles its shards through :func:`mark_ended` too.
"""

from __future__ import annotations

import time
from typing import Optional

from agent_stdlib import states
from agent_stdlib.attempts import (
    advance_attempt,
    created_record,
    load_attempt,
    load_readiness,
    publish_readiness,
)
from agent_stdlib.contracts import AttemptRecord, ReadinessRecord, WinnerRecord
from agent_stdlib.layout import RunLayout
from agent_stdlib.publish import complete_winner
from agent_stdlib.statefile import StateError, publish_json_immutable


def complete_missing_winner(layout: RunLayout, shard: int, attempt: int) -> WinnerRecord:
    """Publish ``winner.json`` of ``shard`` from its succeeded ``attempt``; return the winner.

    Idempotent (returns an existing winner unchanged). Raises StateError when the attempt
    is not ``succeeded`` or its ``result.json`` or files do not check out.
    """
    return complete_winner(layout, shard, attempt)


def mark_ended(layout: RunLayout, shard: int, attempt: int, state: str,
               reason: str, run_id: Optional[str] = None) -> AttemptRecord:
    """Record an attempt no process can write any more as ``state`` with ``reason``.

    With ``run_id``, an attempt folder without a record (a first attempt whose submit has
    not written it: ``created``) gets its terminal record at once, unless one appears.

    For callers that know the attempt's job has left Slurm (or never had one): its
    readiness, if it is still open, is closed out as ``failed`` too, so nothing keeps
    advertising endpoints of an allocation that is gone. Re-reads the attempt first: if
    its agent wrote a terminal record after the caller looked, that record is returned
    unchanged.
    """
    path = layout.attempt(shard, attempt).attempt_json
    current = load_attempt(path)
    if current is None and run_id is not None and path.parent.is_dir():
        record = created_record(run_id, shard, attempt, time.time()).replace(
            state=state, reason=reason)  # created -> state, as one record
        if publish_json_immutable(path, record.to_dict()):  # never over a new record
            return record
        current = load_attempt(path)
    if current is None:
        raise StateError(f"{path}: attempt record is missing")
    if current.state in states.TERMINAL:
        return current
    try:
        record = advance_attempt(path, state, reason=reason)
    except states.TransitionError:  # a concurrent writer finished it first
        latest = load_attempt(path)
        return latest if latest is not None else current
    close_readiness(layout, shard, attempt, f"the allocation ended without its agent: "
                                            f"{reason}")
    return record


def close_readiness(layout: RunLayout, shard: int, attempt: int,
                    reason: str) -> Optional[ReadinessRecord]:
    """Publish the next readiness revision as ``failed`` unless it is closed (or absent)."""
    path = layout.attempt(shard, attempt).readiness_json
    current = load_readiness(path)
    if current is None or current.state in states.READINESS_CLOSED:
        return current
    return publish_readiness(path, shard, attempt, current.execution, states.READY_FAILED,
                             reason=reason)
