"""Status: durable state plus one batched squeue and one sacct call -> shard states."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

from agent_stdlib import states
from agent_stdlib.layout import RunLayout
from control.runs.store import ShardRecords, load_plan, load_run, load_shard, load_submissions
from control.slurm.parsers import JobRow
from control.slurm.scheduler import Scheduler

ACTIVE_QUEUE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                "RESIZING", "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED"}
CANCELLED_STATES = {"CANCELLED", "REVOKED"}


@dataclass(frozen=True)
class ShardStatus:
    """One shard as the user sees it."""

    index: int
    state: str
    attempt: Optional[int]
    job_id: Optional[str]
    records: int
    records_done: int
    reason: Optional[str] = None


def _scheduler_view(job_id: Optional[str], queue: Dict[str, JobRow],
                    acct: Optional[Dict[str, JobRow]]) -> Optional[JobRow]:
    if not job_id:
        return None
    if acct is not None and job_id in acct and acct[job_id].state not in ACTIVE_QUEUE:
        return acct[job_id]  # terminal accounting beats a stale queue row
    if job_id in queue:
        return queue[job_id]
    return acct.get(job_id) if acct else None


def normalize(records: ShardRecords, num_records: int, row: Optional[JobRow]) -> ShardStatus:
    """Combine one shard's durable records with the scheduler's row for its job."""
    attempt = records.attempt
    done = records.progress.records_done if records.progress else 0
    base = dict(index=records.index, attempt=attempt.attempt if attempt else None,
                job_id=attempt.job_id if attempt else None, records=num_records)
    if records.problem:
        return ShardStatus(state="unknown", records_done=done, reason=records.problem, **base)
    if records.winner is not None:
        return ShardStatus(state=states.SUCCEEDED, records_done=num_records, **base)
    if attempt is None:
        return ShardStatus(state="unknown", records_done=0, reason="no attempt record", **base)
    if attempt.state in states.TERMINAL or attempt.state == states.CREATED:
        return ShardStatus(state=attempt.state, records_done=done, reason=attempt.reason, **base)
    return ShardStatus(records_done=done, **base, **_from_scheduler(attempt.state, row))


def _from_scheduler(recorded: str, row: Optional[JobRow]) -> Dict[str, Any]:
    if row is None:
        return {"state": recorded, "reason": "not seen by the scheduler (accounting lag?)"}
    if row.state in ACTIVE_QUEUE:
        if row.state == "PENDING":
            return {"state": states.PENDING, "reason": row.reason}
        return {"state": states.RUNNING if recorded == states.RUNNING else "starting",
                "reason": None}
    if row.state in CANCELLED_STATES:
        return {"state": states.CANCELLED, "reason": f"job {row.state.lower()}"}
    detail = f"exit {row.exit_code}" + (f", signal {row.signal}" if row.signal else "")
    return {"state": states.FAILED,
            "reason": f"job ended {row.state} ({detail}) before the agent recorded an outcome"}


def run_state(shards: List[ShardStatus]) -> str:
    """The run's state from its shards' states."""
    seen = {s.state for s in shards}
    if seen == {states.SUCCEEDED}:
        return states.SUCCEEDED
    if seen <= states.TERMINAL:
        return states.CANCELLED if states.CANCELLED in seen else states.FAILED
    return states.RUNNING


def observe(layout: RunLayout, scheduler: Scheduler) -> Dict[str, Any]:
    """The full status of a run as plain data (what ``status --json`` prints)."""
    run = load_run(layout)
    plan = load_plan(layout)
    records = [load_shard(layout, s.index) for s in plan.shards]
    job_ids = sorted({s.job_id for s in load_submissions(layout) if s.job_id})
    pending = any(r.winner is None and r.attempt and r.attempt.state not in states.TERMINAL
                  for r in records)
    queue = scheduler.queue(job_ids) if pending else {}
    acct = scheduler.accounting(job_ids) if pending else {}
    shards = [normalize(r, plan.shards[r.index].num_records,
                        _scheduler_view(r.attempt.job_id if r.attempt else None, queue, acct))
              for r in records]
    counts: Dict[str, int] = {}
    for shard in shards:
        counts[shard.state] = counts.get(shard.state, 0) + 1
    return {
        "run_id": plan.run_id,
        "name": plan.name,
        "committed": run is not None,
        "state": run_state(shards) if run is not None else "uncommitted",
        "records": plan.total_records,
        "records_done": sum(s.records_done for s in shards),
        "counts": dict(sorted(counts.items())),
        "accounting": acct is not None,
        "shards": [asdict(s) for s in shards],
    }
