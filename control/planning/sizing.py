"""Sizing jobs for a deadline from one measured point (pure): the rule ``benchmark
analyze`` recommends with and the automatic layout sizes a deadline with."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple


def percentile(values: List[float], q: float) -> Optional[float]:
    """The ``q`` (0-100) percentile by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


BOOT_FROM = {"sacct": "job start -> first record, model load included (sacct)",
             "generator": "endpoints ready -> first record; the model load is not "
                          "measured without sacct"}


def sizing_boot(row: Dict[str, Any]) -> Tuple[float, str]:
    """The boot a job of this point pays before its records flow, and where it is from:
    ``sacct`` (job start -> ready, plus ready -> first record) or ``generator`` (ready ->
    first record only, when accounting does not know the job)."""
    generator = row.get("boot_s") or 0.0
    job = row.get("job_boot_s")
    if isinstance(job, (int, float)):
        return job + generator, "sacct"
    return generator, "generator"


def size(row: Dict[str, Any], targets: Dict[str, Any]) -> Dict[str, Any]:
    """Jobs, wall time and GPU-hours for ``targets`` at one point, feasible or not and why."""
    out = {"case": row["case"], "concurrency": row["concurrency"]}
    deadline = targets["deadline_hours"] * 3600.0
    boot, boot_from = sizing_boot(row)
    rate = row.get("records_per_s")
    out.update(boot_s=boot, boot_from=boot_from)
    if not rate:
        return {**out, "feasible": False, "why": "no throughput measured"}
    if row.get("error_rate", 0.0) > 0.01:
        return {**out, "feasible": False,
                "why": f"{row['error_rate']:.1%} of requests failed at this point"}
    if deadline <= boot:
        return {**out, "feasible": False, "why": f"boot ({boot:.0f} s) exceeds the deadline"}
    jobs = max(1, math.ceil(targets["records"] / (rate * (deadline - boot))))
    wall = boot + targets["records"] / jobs / rate
    gpu_hours = jobs * row["gpus"] * wall / 3600.0
    out.update(jobs=jobs, wall_hours=wall / 3600.0, gpu_hours=gpu_hours)
    limit = targets.get("max_jobs")
    if limit is not None and jobs > limit:
        return {**out, "feasible": False,
                "why": f"needs {jobs} jobs, more than max_jobs {limit}"}
    return {**out, "feasible": True,
            "why": f"{jobs} job(s) of {row['gpus']} GPU(s) at {rate:.2f} records/s each "
                   f"finish in {wall / 3600.0:.2f} h of the {targets['deadline_hours']:g} h "
                   f"(boot {boot:.0f} s: {BOOT_FROM[boot_from]})"}
