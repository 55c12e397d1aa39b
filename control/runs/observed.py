"""A run's status as ``api.status`` returns it: one refresh of the records and the
scheduler (``runs.status.refresh``), the automatic retry if asked, and what is said
about it (blocked shards, totals, reuse, cost, serving flags, the automatic rounds).

Imports happen inside the functions, so that ``synthbatch status`` starts quickly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from synthbatch.agent_stdlib.layout import RunLayout, job_name
from synthbatch.agent_stdlib.states import FAILED

if TYPE_CHECKING:
    from synthbatch.control.runs.status.refresh import Refresh


def observed(layout: RunLayout, sched: Any, profile_path: Optional[Path] = None,
             retry: Optional[Callable[[], Any]] = None) -> Refresh:
    """One refresh, presented. ``retry`` (``api.status(auto_retry=True)``) submits the next
    attempt of failed shards (``retry_run(..., auto=True)``'s result; Conflict when
    another retry holds the lock); it is called only when a shard failed and the
    scheduler answered, and the run is refreshed again when it submitted something."""
    from synthbatch.control.errors import Conflict
    from synthbatch.control.runs.status.refresh import unreachable

    fresh = _refresh(layout, sched)
    data = fresh.summary
    if retry is not None and data["counts"].get(FAILED) and not unreachable(data):
        try:
            done = retry()
        except Conflict as err:
            data.update(retried=[], notes=[*data["notes"], err.message])
        else:
            notes = [done.selection.skipped[s] for s in sorted(done.selection.skipped)]
            if done.submitted:
                fresh = _refresh(layout, sched)
            fresh.summary.update(retried=[c.to_dict() for c in done.submitted],
                                 notes=[*fresh.summary["notes"], *notes])
    return _presented(layout, fresh, sched, profile_path)


def _refresh(layout: RunLayout, sched: Any) -> Refresh:
    """``refresh`` plus ``backend``: which scheduler answered (and, for the local backend,
    where each supervisor of the run is)."""
    from synthbatch.control.runs.status.refresh import refresh

    fresh = refresh(layout, sched, with_usage=True)
    fresh.summary["backend"] = sched.describe(job_name(layout.root.name))
    return fresh


def _presented(layout: RunLayout, fresh: Refresh, sched: Any,
               profile_path: Optional[Path] = None) -> Refresh:
    """The refresh with what is said about it: pending reasons that block shards
    (``blocked``: from the rows read this time, as a settled shard is never pending; and
    ``pending_reasons``, how many pending shards wait for each of Slurm's reasons) and
    the run's numbers (``totals``: from the index's columns, no settled row is built)."""
    from synthbatch.control.runs.status.pending import blocked, reasons
    from synthbatch.control.runs.status.totals import totals

    summary = fresh.summary
    summary["blocked"] = blocked(fresh.fresh)
    summary["pending_reasons"] = reasons(fresh.fresh)
    used: Dict[str, Any] = {}
    summary["totals"] = totals(layout, summary, sched, jobs=lambda: fresh.column("job_id"),
                               ended=fresh.ended_at, job_ids=fresh.job_ids, usage=fresh.usage,
                               used=used, submissions=fresh.submissions)
    from synthbatch.control.runs import reusecount  # issue 31: reused cells apart

    summary["reuse"] = reusecount.counts(layout, sum(summary.get("counts", {}).values()))
    if summary["reuse"] is not None:
        reusecount.generated(summary["totals"], summary.get("records_done", 0),
                             summary["reuse"])
    from synthbatch.control.runs.cost import status_cost  # issue 32: what records cost

    summary["cost"] = status_cost(layout, summary, used, fresh.job_ids, profile_path,
                                  lambda: sched.usage(fresh.job_ids), fresh.plan)
    from synthbatch.control.runs.autoretry import round_now  # issue 34: the pending automatic round
    from synthbatch.control.runs.store import load_plan
    from synthbatch.control.runs.telemetry import run_flags  # issue 32: idle or saturated

    summary["serving_flags"] = run_flags(layout, fresh.fresh, time.time())
    summary["auto_retry"] = round_now(layout, sched, fresh.rows,  # the plan: only if pending
                                      lambda: load_plan(layout).max_attempts)
    if summary["auto_retry"] is None and not summary.get("scheduler_error"):
        from synthbatch.control.runs.autoretry import lost_note  # a round job that died

        summary["notes"] = [*summary["notes"], *filter(None, [lost_note(layout, sched)])]
    from synthbatch.control.runs import automerge  # the merge on completion, attempts' budget

    summary["merge"] = automerge.view(layout)
    summary["max_attempts"] = automerge.load_settings(layout)["max_attempts"]
    return fresh
