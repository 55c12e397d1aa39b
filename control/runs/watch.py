"""Polling without hammering slurmctld: exponential backoff to a cap, never a tight loop.

Each refresh of ``status --watch`` is one ``observe`` (one squeue call, plus one sacct call
only for jobs squeue no longer knows). While nothing changes the interval grows by
``factor`` up to ``cap_s``; a change brings it back to ``base_s``; a scheduler error
doubles it. It never drops below ``floor_s``, which keeps a watcher far under Slurm's
RPC rate limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from control.errors import (
    Conflict,
    RunCancelled,
    RunFailed,
    SchedulerUnavailable,
    StillRunning,
    SynthbatchError,
)
from control.runs.normalize import CANCELLED, FAILED, FINAL, SUCCEEDED

Snapshot = Dict[str, Any]


@dataclass
class Backoff:
    """The next wait: ``base_s`` after a change, growing by ``factor`` to ``cap_s``."""

    base_s: float = 2.0
    cap_s: float = 30.0
    factor: float = 1.5
    floor_s: float = 1.0
    current: float = field(default=0.0)

    def next(self, changed: bool, failed: bool = False) -> float:
        """The wait before the next refresh."""
        if not self.current or (changed and not failed):
            self.current = self.base_s
        else:
            self.current *= 2 if failed else self.factor
        self.current = max(self.floor_s, min(self.current, self.cap_s))
        return self.current


def fingerprint(snapshot: Snapshot) -> tuple:
    """What counts as a change between two refreshes."""
    return (snapshot.get("state"), tuple(sorted(snapshot.get("counts", {}).items())),
            snapshot.get("records_done"), snapshot.get("scheduler_error"))


def finished(snapshot: Snapshot) -> bool:
    """True once the run can no longer change by itself."""
    return snapshot.get("state") in FINAL or snapshot.get("state") == "uncommitted"


def watch(fetch: Callable[[], Snapshot], show: Callable[[Snapshot], None],
          backoff: Optional[Backoff] = None, max_s: Optional[float] = None,
          clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> Snapshot:
    """Refresh and show until the run ends (or ``max_s`` passes); return the last snapshot."""
    backoff = backoff or Backoff()
    start, previous = clock(), None
    while True:
        snapshot = fetch()
        show(snapshot)
        if finished(snapshot):
            return snapshot
        failed = snapshot.get("scheduler_error") is not None
        wait = backoff.next(changed=fingerprint(snapshot) != previous, failed=failed)
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
    and no failure RunCancelled (7); every shard succeeded is None. A run that is not over
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
        bad = counts.get(FAILED, 0) + counts.get("lost", 0)
        first = next(iter(snapshot.get("failures", [])), None)
        why = f" (shard {first['shard']}: {first['reason']})" if first and first.get(
            "reason") else ""
        return RunFailed(f"run {run} failed: {bad} of {total} shard(s) failed{why}", hint=hint)
    if state == CANCELLED:
        return RunCancelled(f"run {run} was cancelled: {counts.get(CANCELLED, 0)} of {total} "
                            f"shard(s) cancelled", hint=hint)
    if not waited:
        return None
    if snapshot.get("scheduler_error"):
        return SchedulerUnavailable(f"run {run} is not over and Slurm could not be asked: "
                                    f"{snapshot['scheduler_error']}",
                                    hint=snapshot.get("scheduler_hint"))
    done = f"{snapshot.get('records_done', 0)}/{snapshot.get('records', 0)} records"
    return StillRunning(f"run {run} is still {state} ({done}) after the wait's time limit")
