"""Polling without hammering slurmctld: exponential backoff to a cap, never a tight loop.

Each refresh of ``status --watch`` is one ``observe`` (one squeue call, plus one sacct call
only for jobs squeue no longer knows). While nothing changes the interval grows by
``factor`` up to ``cap_s``; a change brings it back to ``base_s``; a scheduler error
doubles it.

Two floors, whichever is higher:

* ``floor_s`` (1 s): nothing a refresh shows changes faster. The agent rewrites its
  progress file about once a second, and Slurm keeps job times in whole seconds; its
  scheduler starts pending jobs on events and on passes every ``sched_interval`` (60 s by
  default, 2 s on the testbed), so a faster poll only repeats the same answer.
* ``1 / busy_share`` times the last refresh's own duration (10x by default): a watcher
  spends at most ~10% of its time, and of the metadata load it puts on the shared
  filesystem, refreshing. That floor grows with the run: a refresh reads one record per
  shard that has not settled (see ``settled``), so a run of 100,000 open shards on a
  filesystem with 1 ms metadata round trips (~2 s a refresh) is refreshed every ~20 s at
  most, not every 2 s; the cap grows with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from synthbatch.control.errors import (
    Conflict,
    RunCancelled,
    RunFailed,
    RunStuck,
    SchedulerUnavailable,
    StillRunning,
    SynthbatchError,
)
from synthbatch.control.runs.status.verdict import CANCELLED, FAILED, FAILING, FINAL, SUCCEEDED

Snapshot = Dict[str, Any]


@dataclass
class Backoff:
    """The next wait: ``base_s`` after a change, growing by ``factor`` to ``cap_s``."""

    base_s: float = 2.0
    cap_s: float = 30.0
    factor: float = 1.5
    floor_s: float = 1.0
    busy_share: float = 0.1  # at most this share of the time is spent refreshing
    current: float = field(default=0.0)

    def next(self, changed: bool, failed: bool = False, took_s: float = 0.0) -> float:
        """The wait before the next refresh (``took_s``: how long the last one took)."""
        floor = max(self.floor_s, took_s / self.busy_share)
        if not self.current or (changed and not failed):
            self.current = self.base_s
        else:
            self.current *= 2 if failed else self.factor
        self.current = max(floor, min(self.current, self.cap_s))
        return self.current


def fingerprint(snapshot: Snapshot) -> tuple:
    """What counts as a change between two refreshes."""
    return (snapshot.get("state"), tuple(sorted(snapshot.get("counts", {}).items())),
            snapshot.get("records_done"), snapshot.get("scheduler_error"))


def stuck(snapshot: Snapshot) -> List[Dict[str, Any]]:
    """The ``blocked`` groups that keep a run from ever ending (empty: none do): the run is
    not over and every shard that is not final pends with a reason Slurm calls permanent
    (``never``: the job cannot start as submitted; ``control.runs.status.pending``)."""
    if snapshot.get("state") in FINAL:
        return []
    counts = snapshot.get("counts", {})
    open_shards = sum(n for state, n in counts.items() if state not in FINAL)
    never = [g for g in snapshot.get("blocked") or [] if g.get("never")]
    if not open_shards or sum(len(g["shards"]) for g in never) != open_shards:
        return []
    return never


def finished(snapshot: Snapshot) -> bool:
    """True once the run can no longer change by itself (over, never committed, or
    ``stuck``)."""
    if snapshot.get("auto_retry"):  # a round job will submit more attempts (issue 34)
        return False
    return snapshot.get("state") in FINAL or snapshot.get("state") == "uncommitted" \
        or bool(stuck(snapshot))


def watch(fetch: Callable[[], Snapshot], show: Callable[[Snapshot], None],
          backoff: Optional[Backoff] = None, max_s: Optional[float] = None,
          clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> Snapshot:
    """Refresh and show until the run ends (or ``max_s`` passes); return the last snapshot."""
    backoff = backoff or Backoff()
    start, previous = clock(), None
    while True:
        began = clock()
        snapshot = fetch()
        took = clock() - began
        show(snapshot)
        if finished(snapshot):
            return snapshot
        failed = snapshot.get("scheduler_error") is not None
        wait = backoff.next(changed=fingerprint(snapshot) != previous, failed=failed,
                            took_s=took)
        previous = fingerprint(snapshot)
        if max_s is not None:
            left = max_s - (clock() - start)
            if left <= 0:
                return snapshot
            wait = min(wait, left)
        sleep(wait)


def outcome(snapshot: Snapshot, waited: bool = True) -> Optional[SynthbatchError]:
    """The error a script's exit status reports for a refresh (None: exit 0).

    A run that ended with a failed (or lost) shard is RunFailed (6), with cancelled shards
    and no failure RunCancelled (7); every shard succeeded is None. A run that is ``stuck``
    (its open shards can never start) is RunStuck (9), waited for or not. A run that is not over
    is StillRunning (8) when ``waited`` (the wait's time ran out; SchedulerUnavailable, 5,
    when the last refresh could not ask Slurm), else None.
    """
    state, run = snapshot.get("state"), snapshot.get("run_id")
    if state == SUCCEEDED:
        return None
    if state == "uncommitted":
        return Conflict(f"run {run} was never committed (its submit did not finish)")
    counts = snapshot.get("counts", {})
    total = sum(counts.values())
    hint = f"synthbatch status {run}; synthbatch retry {run}"
    if state == FAILED:
        bad = sum(counts.get(state, 0) for state in FAILING)
        first = next(iter(snapshot.get("failures", [])), None)
        why = f" (shard {first['shard']}: {first['reason']})" if first and first.get(
            "reason") else ""
        return RunFailed(f"run {run} failed: {bad} of {total} shard(s) failed{why}", hint=hint)
    if state == CANCELLED:
        return RunCancelled(f"run {run} was cancelled: {counts.get(CANCELLED, 0)} of {total} "
                            f"shard(s) cancelled", hint=hint)
    never = stuck(snapshot)
    if never:
        first = never[0]
        shards = sum(len(g["shards"]) for g in never)
        return RunStuck(f"run {run} can never finish: {shards} of {total} shard(s) pending "
                        f"with a reason Slurm keeps (shard {first['shards'][0]}: "
                        f"{first['reason']}: {first['hint']})",
                        hint=f"synthbatch cancel {run}")
    if not waited:
        return None
    if snapshot.get("scheduler_error"):
        return SchedulerUnavailable(f"run {run} is not over and Slurm could not be asked: "
                                    f"{snapshot['scheduler_error']}",
                                    hint=snapshot.get("scheduler_hint"))
    done = f"{snapshot.get('records_done', 0)}/{snapshot.get('records', 0)} records"
    return StillRunning(f"run {run} is still {state} ({done}) after the wait's time limit")
