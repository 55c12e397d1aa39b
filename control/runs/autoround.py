"""One automatic retry round (issue 34): refresh, retry what failed below the limit, then
submit the successor round while anything can still change (rules: ``autoretry``)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from synthbatch.agent_stdlib.arrays import array_job_id
from synthbatch.control.backends.local.rounds import ROUND_JOB_ENV
from synthbatch.control.runs import automerge
from synthbatch.control.runs.autoretry import (
    IDLE_BEGIN,
    MERGE,
    Decision,
    RetryLock,
    clear_pending,
    decide,
    halted,
    load_pending,
    record_pending,
    submit_round,
)
from synthbatch.control.runs.retry import retry_run
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.runs.status.refresh import observe
from synthbatch.control.runs.status.rows import ShardRow
from synthbatch.control.runs.store import load_plan

if TYPE_CHECKING:
    from synthbatch.agent_stdlib.layout import RunLayout
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.slurm.scheduler import Scheduler


def run_round(layout: RunLayout, profile: Profile, scheduler: Scheduler) -> Decision:
    """One round: refresh, retry the failed shards below the limit, then the successor, or,
    once the run is over, the merge job it asked for (``<run>/auto/settings.json``)."""
    plan = load_plan(layout)
    wanted = automerge.load_settings(layout)
    merge = wanted["merge"] or {}
    seen = observe(layout, scheduler)
    shards = [ShardRow.from_dict(r) for r in seen["shards"]]
    decision = decide(shards, plan.max_attempts if wanted["auto_retry"] else 1,
                      bool(merge), bool(merge.get("allow_partial")))
    after: List[str] = []
    retried: Tuple[int, ...] = ()
    pending = load_pending(layout)
    attempt = int(pending.get("attempt") or 1) if pending else 1
    if decision.retry and not halted(layout):  # asked again under the lock (retry_run)
        done = retry_run(layout, profile, scheduler, auto=True, halted=lambda: halted(layout))
        after = [str(s["job_id"]) for s in done.submissions if s.get("job_id")]
        attempt = max([attempt, *(c.attempt for c in done.submitted)])
        retried = tuple(c.shard for c in done.submitted)
    number = int(pending.get("round", 0)) + 1 if pending else 1
    own = os.environ.get("SLURM_JOB_ID") or os.environ.get(ROUND_JOB_ENV)
    local = getattr(scheduler, "ROUNDS_IN_SUPERVISOR", False)  # no plain jobs: in place
    # the next automatic job also waits for this one: never two of them running together
    last = [own] if own and not local else []
    with RetryLock(layout):
        stopped = halted(layout)  # cancel of the run: no successor, no merge, nothing
        if stopped:
            record_pending(layout, None, number - 1, (), attempt=attempt)
            return replace(decision, retry=retried, over=True, merge=False, halted=stopped)
        if decision.successor:
            jobs = after or sorted({array_job_id(str(r.job_id)) for r in shards
                                    if r.job_id and r.state not in norm.FINAL})
            if local:  # the supervisor of one of these jobs runs the next round
                record_pending(layout, jobs[0] if jobs else None, number, jobs,
                               attempt=attempt)
            else:
                # nothing to wait for (its refresh came before a manual retry, or the
                # shards' jobs are not known yet): a minute's pause, not a busy chain
                submit_round(layout, profile, scheduler, plan.run_id, [*jobs, *last], number,
                             own_job=own, attempt=attempt,
                             begin=None if jobs else IDLE_BEGIN)
        elif decision.merge and local:  # shown "merging" while this supervisor merges
            record_pending(layout, own, number, (), MERGE, attempt)
        elif decision.merge:
            submit_round(layout, profile, scheduler, plan.run_id, last, number, own_job=own,
                         action=MERGE, attempt=attempt)
        else:
            if merge and decision.over:
                automerge.record_result(layout, automerge.not_merged(
                    s.index for s in shards if s.state != norm.SUCCEEDED))
            record_pending(layout, None, number - 1, (), attempt=attempt)
    if decision.merge and local:
        merge_job(layout)
    return decision


def merge_job(layout: RunLayout) -> Dict[str, object]:
    """The merge job: the run's merge (``automerge.run_merge``), then no job is pending."""
    result = automerge.run_merge(layout)
    with RetryLock(layout):
        clear_pending(layout)
    return result


def start(layout: RunLayout, profile: Profile, scheduler: Scheduler, run_id: str,
          job_ids: Sequence[str], settings: Dict[str, object]) -> Optional[str]:
    """After submit: record the run's automatic ``settings`` (``automerge.settings``), then
    the first round job, after the run's arrays; None when there is none.

    None when nothing is automatic (retries off or one attempt is all the run allows, and
    no merge asked for). On the local backend no job is submitted: the record names the
    array's job, whose supervisor runs the round (``control.backends.local.rounds``).
    """
    automerge.save_settings(layout, settings)
    if not wanted(settings) or not job_ids:
        return None
    if getattr(scheduler, "ROUNDS_IN_SUPERVISOR", False):  # the array's supervisor runs it
        with RetryLock(layout):
            record_pending(layout, job_ids[0], 1, list(job_ids))
        return job_ids[0]
    if not hasattr(scheduler, "submit_job"):
        return None
    with RetryLock(layout):
        return submit_round(layout, profile, scheduler, run_id, list(job_ids), 1)


def wanted(settings: Dict[str, object]) -> bool:
    """Whether a run with these settings has automatic jobs at all."""
    retries = bool(settings.get("auto_retry")) and int(settings.get("max_attempts") or 1) > 1
    return retries or bool(settings.get("merge"))
