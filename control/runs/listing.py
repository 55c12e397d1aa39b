"""A run's state from its directory alone (for ``runs``; ``status`` also asks Slurm)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, Optional

from agent_stdlib import states
from agent_stdlib.layout import RunLayout
from agent_stdlib.statefile import StateError
from control.runs import normalize as norm
from control.runs import settled
from control.runs.store import ShardView, expected_lookup, scan_shard, submission_views

DURABLE = {
    states.CREATED: norm.CREATED,
    states.SUBMITTED: norm.PENDING,
    states.PENDING: norm.PENDING,
    states.RUNNING: norm.RUNNING,
    states.SUCCEEDED: norm.SUCCEEDED,
    states.FAILED: norm.FAILED,
    states.CANCELLED: norm.CANCELLED,
}


def durable_shard_state(view: ShardView) -> str:
    """What the records alone say about one shard."""
    if view.winner:
        return norm.SUCCEEDED
    if view.winner_problem or view.attempt is None:
        return norm.UNKNOWN
    return DURABLE.get(view.attempt.state, norm.UNKNOWN)


# What a settled row says without Slurm: a lost shard's attempt is recorded ``failed``.
SETTLED = {"succeeded": norm.SUCCEEDED, "failed": norm.FAILED, "cancelled": norm.CANCELLED,
           "lost": norm.FAILED}


def durable_state(layout: RunLayout, shard_count: int,
                  run_id: Optional[str] = None) -> Dict[str, Any]:
    """``{"state", "counts"}`` of a run from its shard records, without Slurm.

    With ``run_id`` the shards the settled index holds (``control.runs.settled``; status
    maintains it, this only reads it) are counted from it, and only the others are read.
    """
    index = settled.check(layout, settled.load(layout), run_id, shard_count) \
        if run_id else settled.Index()
    known = index.positions()
    counts: Counter = Counter(SETTLED[settled.CODE_STATES[index.codes[p]]]
                              for p in known.values())
    todo = [i for i in range(shard_count) if i not in known]
    if todo:
        try:
            expected = expected_lookup(submission_views(layout))
        except StateError:  # a bad submission record: list every shard's folders instead
            expected = {}.get
        counts.update(durable_shard_state(scan_shard(layout, i, expected(i))) for i in todo)
    return {"state": norm.run_state(dict(counts), True), "counts": dict(sorted(counts.items()))}
