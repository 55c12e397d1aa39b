"""A run's state from its directory alone (for ``runs``; ``status`` also asks Slurm)."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.layout import RunLayout, runs_root
from synthbatch.agent_stdlib.statefile import StateError
from synthbatch.control.errors import SynthbatchError
from synthbatch.control.runs import automerge, autoretry
from synthbatch.control.runs.status import index as settled
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.runs.status.records import (
    ShardView,
    load_plan_view,
    shard_scanner,
    submission_views,
)
from synthbatch.control.runs.store import last_moment, load_run, run_layout

# an attempt's state as the shard's (the shard words are the attempt words; ``submitted``
# shows as pending)
DURABLE = {**{state: state for state in states.ATTEMPT_STATES}, states.SUBMITTED: norm.PENDING}


def durable_shard_state(view: ShardView) -> str:
    """What the records alone say about one shard."""
    if view.winner:
        return norm.SUCCEEDED
    if view.winner_problem or view.attempt is None:
        return norm.UNKNOWN
    return DURABLE.get(view.attempt.state, norm.UNKNOWN)


# What a settled row says without Slurm: the state status recorded on its attempt.
SETTLED = {state: report.recorded[0] if report.recorded else state
           for state, report in norm.REPORT.items() if report.code}


def durable_state(layout: RunLayout, shard_count: int,
                  sizes: Optional[Sequence[int]] = None,
                  run_id: Optional[str] = None) -> Dict[str, Any]:
    """``{"state", "counts"}`` of a run from its shard records, without Slurm.

    With the shards' ``sizes`` (records per shard, from the plan) also ``records_done``
    (winners count whole, others by their progress) and ``ended_at``: when the last shard
    of a final run was recorded (None while it is not final). With ``run_id`` the shards
    the settled index holds (``control.runs.status.index``; status maintains it, this only
    reads it) are counted from it, and only the others are read.
    """
    index = settled.check(layout, settled.load(layout), run_id, shard_count) \
        if run_id else settled.Index()
    known = index.positions()
    counts: Counter = Counter(SETTLED[settled.CODE_STATES[index.codes[p]]]
                              for p in known.values())
    done = index.sums["records_done"] if len(known) == len(index.codes) else \
        sum(row.records_done for row in index.rows(sorted(known.values())))
    ended = index.ended_at if known else 0.0
    todo = [i for i in range(shard_count) if i not in known]
    if todo:
        scan = shard_scanner(layout, (), many=True)  # states, not job ids: no arrays
        for i in todo:
            view = scan(i)
            counts[durable_shard_state(view)] += 1
            if sizes is not None:
                size = sizes[i]
                done += size if view.winner else min(view.progress.records_done, size) \
                    if view.progress else 0
            if view.attempt is not None:
                ended = max(ended, view.attempt.updated_at)
    state = norm.run_state(dict(counts), True)
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
            found.append({"run_id": folder.name, "state": norm.UNKNOWN, "problem": str(err)})
            continue
        if record is None:
            continue
        try:
            sizes: Optional[Tuple[int, ...]] = load_plan_view(layout).shard_records
        except Exception:  # noqa: BLE001 - a damaged plan: the records still give a state
            sizes = None
        if sizes is not None and len(sizes) != record.shard_count:
            found.append({"run_id": folder.name, "state": norm.UNKNOWN,
                          "problem": f"{layout.run_json}: shard_count {record.shard_count} "
                                     f"is not the plan's {len(sizes)} shards"})
            continue
        # a damaged plan: run.json's count, bounded by the shards that exist, with a
        # folder or named by a submission (a damaged count must not make a listing walk
        # 2**62 shards)
        count = record.shard_count if sizes is not None else \
            min(record.shard_count, _known_shards(layout))
        state = durable_state(layout, count, sizes, record.run_id)
        story = autoretry.listed_story(layout, state["state"],
                                       automerge.load_settings(layout)["max_attempts"])
        if story:
            state["story"] = story
        end = last_moment(state.get("ended_at") or now, now)
        found.append({"run_id": record.run_id, "name": record.name,
                      "created_at": record.created_at, "shards": record.shard_count,
                      **state, "elapsed_s": round(max(0.0, end - record.created_at), 1)})
    found.sort(key=lambda r: r.get("created_at", 0), reverse=True)
    return found


def _known_shards(layout: RunLayout) -> int:
    """How many shards are known without the plan: entries of the run's shard folder,
    or one past the highest shard a submission record names (0 when neither is read)."""
    try:
        with os.scandir(layout.shards) as entries:
            folders = sum(1 for _ in entries)
    except OSError:
        folders = 0
    try:
        named = max((int(k) + 1 for r in submission_views(layout) for k in r.attempts),
                    default=0)
    except (StateError, ValueError):
        named = 0
    return max(folders, named)
