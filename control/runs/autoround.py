"""One automatic retry round (issue 34): refresh, retry what failed below the limit, then
submit the successor round while anything can still change (rules: ``autoretry``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, List, Mapping, Optional, Sequence

from synthbatch.control.runs import normalize as norm
from synthbatch.control.runs.autoretry import (
    Decision,
    ShardNow,
    decide,
    load_pending,
    record_pending,
    submit_round,
)
from synthbatch.control.runs.retry import RetryLock, retry_run
from synthbatch.control.runs.status import observe
from synthbatch.control.runs.store import load_plan

if TYPE_CHECKING:
    from synthbatch.agent_stdlib.layout import RunLayout
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.slurm.scheduler import Scheduler


def run_round(layout: RunLayout, profile: Profile, scheduler: Scheduler,
              merge: Optional[Mapping[str, object]] = None) -> Decision:
    """One round: refresh, retry the failed shards below the limit, then the successor."""
    plan = load_plan(layout)
    seen = observe(layout, scheduler)
    shards = [ShardNow(r["index"], r["state"], r["attempt"]) for r in seen["shards"]]
    merge = merge or {}
    decision = decide(shards, plan.max_attempts, bool(merge.get("to")),
                      bool(merge.get("allow_partial")))
    after: List[str] = []
    if decision.retry:
        done = retry_run(layout, profile, scheduler, auto=True)
        after = [str(s["job_id"]) for s in done.submissions if s.get("job_id")]
    pending = load_pending(layout)
    number = int(pending.get("round", 0)) + 1 if pending else 1
    own = os.environ.get("SLURM_JOB_ID")
    with RetryLock(layout):
        if decision.successor:
            jobs = after or sorted({str(r["job_id"]).split("_")[0] for r in seen["shards"]
                                    if r.get("job_id") and r["state"] not in norm.FINAL})
            submit_round(layout, profile, scheduler, plan.run_id, jobs, number, own_job=own)
        else:
            record_pending(layout, None, number - 1, ())
    return decision



def start(layout: RunLayout, profile: Profile, scheduler: Scheduler, run_id: str,
          job_ids: Sequence[str], max_attempts: int, enabled: bool) -> Optional[str]:
    """After submit: the first round job, after the run's arrays; None when there is none.

    None when automatic retries are off, when one attempt is all the run allows, or on a
    backend whose scheduler submits no plain jobs (the local backend, for now).
    """
    if not enabled or max_attempts < 2 or not job_ids or \
            not hasattr(scheduler, "submit_job"):
        return None
    with RetryLock(layout):
        return submit_round(layout, profile, scheduler, run_id, list(job_ids), 1)
