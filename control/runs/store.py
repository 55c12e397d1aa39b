"""Finding runs in a workspace and reading their records tolerantly."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from agent_stdlib.attempts import load_attempt
from agent_stdlib.contracts import (
    AttemptRecord,
    Plan,
    ProgressRecord,
    RunRecord,
    SubmissionRecord,
    WinnerRecord,
)
from agent_stdlib.layout import RunLayout
from agent_stdlib.statefile import StateError, load_record
from control.errors import InvalidInput, NotFound

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ATTEMPT_DIR = re.compile(r"^attempt-(\d{4,})$")


def runs_root(workspace: Path) -> Path:
    """``<workspace>/runs``."""
    return workspace / "runs"


def run_layout(workspace: Path, run_id: str) -> RunLayout:
    """The layout of an existing run; NotFound if there is no such run directory."""
    if not RUN_ID.match(run_id):
        raise InvalidInput(f"run id {run_id!r}: not a valid run id")
    root = runs_root(workspace) / run_id
    if not root.is_dir():
        raise NotFound(f"run {run_id}: no such run in {runs_root(workspace)}")
    return RunLayout(root)


def load_run(layout: RunLayout) -> Optional[RunRecord]:
    """``run.json`` or None when the submit never committed."""
    return load_record(layout.run_json, RunRecord)


def load_plan(layout: RunLayout) -> Plan:
    """The run's plan; NotFound if missing."""
    plan = load_record(layout.plan_json, Plan)
    if plan is None:
        raise NotFound(f"{layout.plan_json}: missing")
    return plan


def load_submissions(layout: RunLayout) -> List[SubmissionRecord]:
    """Every submission record, oldest first."""
    if not layout.submissions.is_dir():
        return []
    found = []
    for path in sorted(layout.submissions.glob("[0-9][0-9][0-9][0-9].json")):
        record = load_record(path, SubmissionRecord)
        if record is not None:
            found.append(record)
    return found


def attempt_numbers(layout: RunLayout, shard: int) -> List[int]:
    """Attempt numbers that exist on disk for ``shard``, ascending."""
    folder = layout.shard_dir(shard) / "attempts"
    if not folder.is_dir():
        return []
    numbers = [int(m.group(1)) for m in (ATTEMPT_DIR.match(p.name) for p in folder.iterdir())
               if m]
    return sorted(numbers)


@dataclass(frozen=True)
class ShardRecords:
    """What the durable state says about one shard (any part may be missing)."""

    index: int
    attempt: Optional[AttemptRecord]
    winner: Optional[WinnerRecord]
    progress: Optional[ProgressRecord]
    problem: Optional[str] = None


def load_shard(layout: RunLayout, shard: int) -> ShardRecords:
    """The latest attempt, the winner and progress of one shard, never raising."""
    try:
        numbers = attempt_numbers(layout, shard)
        attempt = load_attempt(layout.attempt(shard, numbers[-1]).attempt_json) \
            if numbers else None
        winner = load_record(layout.winner_json(shard), WinnerRecord)
        progress = load_record(layout.attempt(shard, numbers[-1]).progress_json, ProgressRecord) \
            if numbers else None
    except (StateError, OSError) as err:
        return ShardRecords(shard, None, None, None, problem=str(err))
    return ShardRecords(shard, attempt, winner, progress)


# ----------------------------------------------------------------------------- fast read path
# ``status`` reads every shard of runs with 10,000+ shards from a fresh process. The
# contract classes validate every field through typing introspection (~0.2 ms a record),
# so this path reads only the fields it shows, checks their types, and reports a record
# that does not fit as the shard's problem (never raising).


@dataclass(frozen=True)
class AttemptView:
    """The fields of ``attempt.json`` that status shows."""

    number: int
    state: str
    job_id: Optional[str]
    reason: Optional[str]
    updated_at: float


@dataclass(frozen=True)
class ProgressView:
    """The fields of ``progress.json`` that status shows."""

    records_done: int
    tokens: int
    rate: float  # records per second, as the client measured it
    updated_at: float


@dataclass(frozen=True)
class ShardView:
    """One shard for status: winner marker, latest attempt, its progress, or a problem."""

    index: int
    winner: bool
    attempt: Optional[AttemptView]
    progress: Optional[ProgressView]
    problem: Optional[str] = None


def _json_object(path: str) -> Optional[Dict[str, Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        raw = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
    except ValueError as err:
        raise StateError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict) or data.get("schema_version") != 1:
        raise StateError(f"{path}: not a schema_version 1 record")
    return data


def _field(data: Dict[str, Any], name: str, kinds: Tuple[type, ...], path: str) -> Any:
    value = data.get(name)
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise StateError(f"{path}: field {name!r} has the wrong type")
    return value


def _attempt_view(path: str) -> Optional[AttemptView]:
    data = _json_object(path)
    if data is None:
        return None
    job_id, reason = data.get("job_id"), data.get("reason")
    if not isinstance(job_id, (str, type(None))) or not isinstance(reason, (str, type(None))):
        raise StateError(f"{path}: job_id/reason have the wrong type")
    return AttemptView(number=_field(data, "attempt", (int,), path),
                       state=_field(data, "state", (str,), path), job_id=job_id,
                       reason=reason, updated_at=float(_field(data, "updated_at",
                                                              (int, float), path)))


def _progress_view(path: str) -> Optional[ProgressView]:
    data = _json_object(path)
    if data is None:
        return None
    return ProgressView(records_done=_field(data, "records_done", (int,), path),
                        tokens=_field(data, "tokens", (int,), path),
                        rate=float(_field(data, "requests_per_s", (int, float), path)),
                        updated_at=float(_field(data, "updated_at", (int, float), path)))


def latest_attempt_dir(layout: RunLayout, shard: int) -> Tuple[bool, Optional[str]]:
    """(winner.json exists, the newest ``attempt-NNNN`` folder) of a shard, by listing.

    Plain strings and two ``listdir`` calls: this runs once per shard of 10,000.
    """
    folder = f"{layout.root}/shards/shard-{shard:05d}"
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return False, None
    winner = "winner.json" in names
    if "attempts" not in names:
        return winner, None
    attempts = [n for n in os.listdir(f"{folder}/attempts") if ATTEMPT_DIR.match(n)]
    if not attempts:
        return winner, None
    return winner, f"{folder}/attempts/{max(attempts, key=lambda n: int(n[8:]))}"


def scan_shard(layout: RunLayout, shard: int) -> ShardView:
    """One shard's status records, tolerant: a bad record becomes ``problem``."""
    try:
        winner, folder = latest_attempt_dir(layout, shard)
        attempt = _attempt_view(f"{folder}/attempt.json") if folder else None
        progress = _progress_view(f"{folder}/progress.json") if folder else None
    except (StateError, OSError) as err:
        return ShardView(shard, False, None, None, problem=str(err))
    return ShardView(shard, winner, attempt, progress)


@dataclass(frozen=True)
class PlanView:
    """What status needs from ``plan.json``: run id, name, and records per shard."""

    run_id: str
    name: str
    total_records: int
    shard_records: Tuple[int, ...]


def load_plan_view(layout: RunLayout) -> PlanView:
    """The plan's shape without full contract validation (merge and submit validate)."""
    try:
        data = _json_object(str(layout.plan_json))
        if data is None:
            raise NotFound(f"{layout.plan_json}: missing")
        shards = data["shards"]
        sizes = tuple(int(s["num_records"]) for s in shards)
        if [s["index"] for s in shards] != list(range(len(shards))):
            raise StateError(f"{layout.plan_json}: shard indices are not 0..n-1")
        return PlanView(run_id=str(data["run_id"]), name=str(data["name"]),
                        total_records=int(data["total_records"]), shard_records=sizes)
    except (KeyError, TypeError, ValueError) as err:
        raise StateError(f"{layout.plan_json}: malformed plan ({err})") from err
