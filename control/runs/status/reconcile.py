"""Reconciliation of what an allocation agent left behind, for ``status`` to apply.

Two situations only the next reader can settle:

* **missing winner**: the agent recorded the attempt ``succeeded`` and died before
  ``winner.json``. ``agent_stdlib.publish.complete_winner`` publishes it from the attempt's
  ``result.json`` after re-hashing every output file (first writer wins, so a racing
  requeued agent and ``status`` still yield one winner).
* **agent gone**: the agent was killed (``kill -9``, node failure, OOM) and its job left
  Slurm without a terminal record. :func:`mark_ended` records the outcome and closes the
  readiness out.

What counts as "gone" and which outcome is recorded is decided in one place,
``control.runs.status.refresh`` (``gone`` and the normalisation table), after its one batched
squeue + sacct call; ``cancel`` settles its shards through :func:`mark_ended` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.attempts import (
    advance_attempt,
    implied_attempt,
    load_attempt,
    load_readiness,
    publish_readiness,
)
from synthbatch.agent_stdlib.contracts import AttemptRecord
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import StateError

if TYPE_CHECKING:
    from synthbatch.control.runs.status.records import AttemptView


def mark_ended(layout: RunLayout, shard: int, attempt: int, state: str,
               reason: str, run_id: Optional[str] = None,
               shown: Optional[AttemptView] = None) -> AttemptRecord:
    """Record an attempt no process can write any more as ``state`` with ``reason``.

    With ``run_id`` and ``shown`` (the attempt as status showed it), an attempt without a
    record (a first attempt its submission implies, or a folder whose record was never
    written) gets its folder and its terminal record at once, unless a record appears
    first (published by link, never over another writer's).

    For callers that know the attempt's job has left Slurm (or never had one): its
    readiness, if it is still open, is closed out as ``failed`` too, so nothing keeps
    advertising endpoints of an allocation that is gone. Re-reads the attempt first: if
    its agent wrote a terminal record after the caller looked, that record is returned
    unchanged.
    """
    path = layout.attempt(shard, attempt).attempt_json
    current = load_attempt(path)
    first = implied_first(run_id, shard, shown) \
        if current is None and run_id is not None and shown is not None else None
    if current is None and first is None:
        raise StateError(f"{path}: attempt record is missing")
    if current is not None and current.state in states.TERMINAL:
        return current
    try:
        record = advance_attempt(path, state, first=first, reason=reason)
    except states.TransitionError:  # a concurrent writer finished it first
        latest = load_attempt(path)
        if latest is not None:
            return latest
        raise
    ready = layout.attempt(shard, attempt).readiness_json
    serving = load_readiness(ready)
    if serving is not None and serving.state not in states.READINESS_CLOSED:
        publish_readiness(ready, shard, attempt, serving.execution, states.READY_FAILED,
                          reason=f"the allocation ended without its agent: {reason}")
    return record


def implied_first(run_id: str, shard: int, shown: AttemptView) -> AttemptRecord:
    """The first revision of an attempt without a record, from status's view of it (which
    ``status.records`` made from its submission record: ``created`` or ``submitted``)."""
    return implied_attempt(run_id, shard, shown.number, shown.job_id, None, shown.updated_at)
