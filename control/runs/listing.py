"""A run's state from its directory alone (for ``runs``; ``status`` also asks Slurm)."""

from __future__ import annotations

from typing import Any, Dict

from agent_stdlib import states
from agent_stdlib.layout import RunLayout
from agent_stdlib.statefile import StateError
from control.runs import normalize as norm
from control.runs.store import ShardView, expected_attempts, scan_shard, submission_views

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


def durable_state(layout: RunLayout, shard_count: int) -> Dict[str, Any]:
    """``{"state", "counts"}`` of a run from its shard records, without Slurm."""
    try:
        expected = expected_attempts(submission_views(layout)).get
    except StateError:  # a bad submission record: list every shard's folders instead
        expected = {}.get
    counts: Dict[str, int] = {}
    for index in range(shard_count):
        state = durable_shard_state(scan_shard(layout, index, expected(index)))
        counts[state] = counts.get(state, 0) + 1
    return {"state": norm.run_state(counts, True), "counts": dict(sorted(counts.items()))}
