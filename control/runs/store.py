"""Finding runs in a workspace and reading their whole records (run, plan, submissions).

Status's fast, tolerant read of the shards is `status/records.py`."""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    List,
    Optional,
    Tuple,
)

from synthbatch.agent_stdlib.layout import (
    FIRST_ATTEMPT,
    RunLayout,
    attempt_number,
    run_dir,
    runs_root,
)
from synthbatch.agent_stdlib.statefile import StateError, load_record
from synthbatch.control.errors import InvalidInput, NotFound
from synthbatch.control.runs.status.records import Expected, checked_job_id, json_object

if TYPE_CHECKING:  # the contract classes cost ~11 ms to import: only the
    # functions that validate whole records import them
    from synthbatch.agent_stdlib.contracts import Plan, RunRecord, SubmissionRecord

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
RUNS_HINT = "'synthbatch runs' lists the runs of this workspace"


def new_run_id(name: str, now: Optional[float] = None) -> str:
    """A sortable, unique run id: ``<name>-<UTC time>-<random>`` (matches ``RUN_ID``)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{name}-{stamp}-{secrets.token_hex(3)}"


def run_id_pattern(name: str) -> str:
    """What :func:`new_run_id` makes of ``name``, as a pattern (``plan`` has no run id:
    only ``submit`` makes one, so a dry run shows this in its place)."""
    return f"{name}-YYYYMMDD-HHMMSS-xxxxxx"


def run_layout(workspace: Path, run_id: str) -> RunLayout:
    """The layout of an existing run; NotFound if there is no such run directory."""
    if not RUN_ID.match(run_id):
        raise InvalidInput(f"run id {run_id!r}: not a valid run id", hint=RUNS_HINT)
    root = run_dir(workspace, run_id)
    if not root.is_dir():
        raise NotFound(f"run {run_id}: no such run in {runs_root(workspace)}", hint=RUNS_HINT)
    return RunLayout(root)


def committed_run_ids(workspace: Path) -> List[str]:
    """The committed runs of ``workspace`` (those with a ``run.json``), newest first by
    when their ``run.json`` was written (then by id); empty when there are none."""
    root = runs_root(workspace)
    found: List[Tuple[float, str]] = []
    try:
        names = os.listdir(root)
    except OSError:
        names = []
    for name in names:
        try:
            stamp = os.stat(f"{root}/{name}/run.json").st_mtime
        except OSError:
            continue  # not committed (or not a run)
        if RUN_ID.match(name):
            found.append((stamp, name))
    return [name for _, name in sorted(found, reverse=True)]


def latest_run_id(workspace: Path) -> str:
    """The run of ``workspace`` committed last (by its ``run.json``); NotFound if none."""
    ids = committed_run_ids(workspace)
    if not ids:
        raise NotFound(f"no runs in {runs_root(workspace)}",
                       hint="submit one with 'synthbatch submit RUN.toml'")
    return ids[0]


def last_moment(ended: float, now: float) -> float:
    """When a finished run ended, by this clock: the last record's time, never later than
    ``now``. Records carry the clock of the node that wrote them; one running ahead of this
    one (measured: 15 minutes on the testbed under libfaketime) would otherwise count its
    offset into ``elapsed_s`` and the averages."""
    return min(ended, now)


def load_run(layout: RunLayout) -> Optional[RunRecord]:
    """``run.json`` or None when the submit never committed."""
    from synthbatch.agent_stdlib.contracts import RunRecord

    return load_record(layout.run_json, RunRecord)


def run_backend(layout: RunLayout) -> Optional[str]:
    """The backend ``run.json`` names (``slurm``/``local``); None before the run committed
    or when the record cannot say (without the contract classes: status reads it)."""
    try:
        data = json_object(str(layout.run_json))
    except StateError:
        return None
    backend = (data or {}).get("backend")
    return backend if isinstance(backend, str) else None


def load_plan(layout: RunLayout) -> Plan:
    """The run's plan; NotFound if missing."""
    from synthbatch.agent_stdlib.contracts import Plan

    plan = load_record(layout.plan_json, Plan)
    if plan is None:
        raise NotFound(f"{layout.plan_json}: missing")
    return plan


def load_submissions(layout: RunLayout) -> List[SubmissionRecord]:
    """Every submission record, oldest first."""
    from synthbatch.agent_stdlib.contracts import SubmissionRecord

    if not layout.submissions.is_dir():
        return []
    found = []
    for path in sorted(layout.submissions.glob("[0-9][0-9][0-9][0-9].json")):
        record = load_record(path, SubmissionRecord)
        if record is not None:
            checked_job_id(record.job_id, str(path))
            found.append(record)
    return found


def attempt_numbers(layout: RunLayout, shard: int,
                    expected: Optional[Expected] = None) -> List[int]:
    """Attempt numbers of ``shard``, ascending: those with a folder on disk, and
    ``expected``'s (the newest a submission names: a first attempt has no folder until
    it starts)."""
    folder = layout.attempts_dir(shard)
    numbers = {n for n in (attempt_number(p.name) for p in folder.iterdir())
               if n is not None} if folder.is_dir() else set()
    if expected is not None and expected.attempt == FIRST_ATTEMPT:
        numbers.add(expected.attempt)
    return sorted(numbers)
