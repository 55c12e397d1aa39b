"""Job start and end times from ``sacct`` (when the cluster keeps accounting): the part of
boot before the endpoints were ready, and the allocation's whole wall time for GPU-hours.

``sacct -n -P -X -j IDS --format=JobID,Start,End`` prints local times
(``2026-12-01T13:24:07``); ``Unknown`` or ``None`` for a job not started or not ended.
Any failure (no accounting, no answer) gives no times: analysis then says so.
"""

from __future__ import annotations

import time
from typing import Dict, Optional, Sequence, Tuple

from synthbatch.control.errors import SchedulerUnavailable
from synthbatch.control.slurm.scheduler import Scheduler

Times = Dict[str, Tuple[Optional[float], Optional[float]]]


def _epoch(text: str) -> Optional[float]:
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse_times(text: str) -> Times:
    """``job id -> (start, end)`` epoch seconds from sacct's lines; bad lines are skipped."""
    found: Times = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0].strip():
            found[parts[0].strip()] = (_epoch(parts[1]), _epoch(parts[2]))
    return found


def job_times(scheduler: Scheduler, job_ids: Sequence[str]) -> Times:
    """Start and end of each job (array task ids ``123_4``); empty when sacct cannot say."""
    ids = sorted({j for j in job_ids if j})
    query = getattr(scheduler, "query", None)  # the local backend keeps no accounting
    if not ids or query is None:
        return {}
    try:
        result = query("sacct", "-n", "-P", "-X", "-j", ",".join(ids),
                       "--format=JobID,Start,End")
    except (SchedulerUnavailable, OSError):
        return {}
    return parse_times(result.stdout) if result.returncode == 0 else {}
