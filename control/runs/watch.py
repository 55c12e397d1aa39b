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

from control.runs.normalize import FINAL

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
