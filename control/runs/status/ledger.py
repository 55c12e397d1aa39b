"""Control-plane records inside a run directory that the agent never reads.

* ``observer/lag.json``: when status first saw each job missing from both squeue and
  sacct. The deadline after which such a job is ``lost`` is persisted here, so every
  fresh ``status`` process agrees on it.
* ``cancels/NNNN.json``: one record per ``synthbatch cancel`` call (which shards, which job
  ids were scancelled), so a cancelled job can be told apart from one killed by hand;
  ``carried_out`` says whether scancel answered (a cancel during an outage is carried out
  by the next status, wait or cancel that reaches Slurm).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Set, Tuple

from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import (
    StateError,
    ensure_dir,
    read_json,
    read_json_or_none,
    write_json_atomic,
)

LAG_GRACE_S = 600.0


def expired_missing(layout: RunLayout, missing: Iterable[str], present: Iterable[str],
                    now: float, grace_s: float = LAG_GRACE_S) -> Set[str]:
    """Job ids missing for longer than ``grace_s``; persists first sightings.

    ``missing`` are ids now in neither squeue nor sacct; ``present`` are ids seen again
    (their entry is dropped). If the run directory is read-only nothing is persisted and
    a new sighting never expires.
    """
    path, key = layout.lag_json, "first_missing"
    seen = (read_json_or_none(path) or {}).get(key, {})
    known = {str(k): float(v) for k, v in seen.items()
             if isinstance(v, (int, float))} if isinstance(seen, dict) else {}
    gone = set(present)
    updated = {k: v for k, v in known.items() if k not in gone}
    missing = list(missing)
    for job_id in missing:
        updated.setdefault(job_id, now)
    if updated != known:
        try:
            ensure_dir(path.parent)
            write_json_atomic(path, {"schema_version": 1, key: updated})
        except (OSError, StateError):
            updated = known
    return {j for j in missing if j in updated and now - updated[j] >= grace_s}


def record_cancel(layout: RunLayout, shards: List[int], job_ids: List[str]) -> Path:
    """Write the next ``cancels/NNNN.json`` (before scancel runs), ``carried_out`` false
    until ``carried_out`` records that scancel answered."""
    folder = ensure_dir(layout.cancels)
    number = len(list(folder.glob("[0-9][0-9][0-9][0-9].json"))) + 1
    path = folder / f"{number:04d}.json"
    write_json_atomic(path, {"schema_version": 1, "requested_at": time.time(),
                             "shards": sorted(shards), "job_ids": sorted(job_ids),
                             "carried_out": False})
    return path


def _cancel_records(layout: RunLayout) -> List[Tuple[Path, Dict[str, Any]]]:
    """Every readable ``cancels/NNNN.json``, in order (a damaged one is skipped)."""
    folder = layout.cancels
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("[0-9][0-9][0-9][0-9].json")):
        data = read_json_or_none(path)
        if data is not None:
            found.append((path, data))
    return found


def carried_out(path: Path) -> None:
    """Record that scancel answered for the cancel request at ``path``."""
    data = read_json(path) or {}
    write_json_atomic(path, {**data, "carried_out": True, "carried_out_at": time.time()})


def pending_cancels(layout: RunLayout) -> List[Tuple[Path, float, List[str]]]:
    """Cancel requests whose scancel never answered (Slurm unreachable, or the cancel died
    before it): (record, requested at, job ids). A record without ``carried_out`` (written
    before it existed) counts as carried out."""
    return [(path, float(data.get("requested_at") or 0.0),
             [j for j in data.get("job_ids", []) if isinstance(j, str)])
            for path, data in _cancel_records(layout) if data.get("carried_out") is False]


def cancel_requested(layout: RunLayout) -> Set[int]:
    """Shards that any ``synthbatch cancel`` call asked to cancel."""
    shards: Set[int] = set()
    for _, data in _cancel_records(layout):
        shards.update(s for s in data.get("shards", []) if isinstance(s, int))
    return shards
