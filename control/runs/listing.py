"""A run's state from its directory alone (for ``runs``; ``status`` also asks Slurm)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from agent_stdlib import states
from agent_stdlib.layout import RunLayout, runs_root
from agent_stdlib.statefile import StateError
from control.errors import SynthbatchError
from control.runs import normalize as norm
from control.runs.store import (
    ShardView,
    expected_attempts,
    load_plan_view,
    load_run,
    run_layout,
    scan_shard,
    submission_views,
)

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


def durable_state(layout: RunLayout, shard_count: int,
                  sizes: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """``{"state", "counts"}`` of a run from its shard records, without Slurm.

    With the shards' ``sizes`` (records per shard, from the plan) also ``records_done``
    (winners count whole, others by their progress) and ``ended_at``: when the last shard
    of a final run was recorded (None while it is not final).
    """
    try:
        expected = expected_attempts(submission_views(layout)).get
    except StateError:  # a bad submission record: list every shard's folders instead
        expected = {}.get
    counts: Dict[str, int] = {}
    done, ended = 0, 0.0
    for index in range(shard_count):
        view = scan_shard(layout, index, expected(index))
        state = durable_shard_state(view)
        counts[state] = counts.get(state, 0) + 1
        if sizes is not None:
            size = sizes[index]
            done += size if view.winner else min(view.progress.records_done, size) \
                if view.progress else 0
        if view.attempt is not None:
            ended = max(ended, view.attempt.updated_at)
    state = norm.run_state(counts, True)
    data: Dict[str, Any] = {"state": state, "counts": dict(sorted(counts.items()))}
    if sizes is not None:
        data.update(records=sum(sizes), records_done=done,
                    ended_at=ended if state in norm.FINAL and ended else None)
    return data


def list_runs(workspace: Path, now: Optional[float] = None) -> List[Dict[str, Any]]:
    """Every committed run of ``workspace``, newest first, from its directory alone:
    state, records done of all, shards, when submitted and how long it ran
    (``elapsed_s``: until its last shard was recorded, or until now while it is not over).
    A run whose records cannot be read is listed with its ``problem``."""
    now = time.time() if now is None else now
    root = runs_root(workspace)
    found: List[Dict[str, Any]] = []
    for folder in sorted(root.iterdir() if root.is_dir() else [], reverse=True):
        try:
            layout = run_layout(workspace, folder.name)
            record = load_run(layout)
        except SynthbatchError:
            continue
        except Exception as err:  # noqa: BLE001 - one bad run must not hide the rest
            found.append({"run_id": folder.name, "state": "unknown", "problem": str(err)})
            continue
        if record is None:
            continue
        try:
            sizes: Optional[Tuple[int, ...]] = load_plan_view(layout).shard_records
        except Exception:  # noqa: BLE001 - a damaged plan: the records still give a state
            sizes = None
        state = durable_state(layout, record.shard_count,
                              sizes if sizes and len(sizes) == record.shard_count else None)
        end = state.get("ended_at") or now
        found.append({"run_id": record.run_id, "name": record.name,
                      "created_at": record.created_at, "shards": record.shard_count,
                      **state, "elapsed_s": round(max(0.0, end - record.created_at), 1)})
    found.sort(key=lambda r: r.get("created_at", 0), reverse=True)
    return found
