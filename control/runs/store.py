"""Finding runs in a workspace and reading their records tolerantly."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from agent_stdlib.attempts import load_attempt
from agent_stdlib.contracts import (
    AttemptRecord,
    ContractError,
    Plan,
    ProgressRecord,
    RunRecord,
    SubmissionRecord,
    WinnerRecord,
)
from agent_stdlib.layout import RunLayout
from agent_stdlib.statefile import StateError, read_json
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


def load_record(path: Path, cls):  # type: ignore[no-untyped-def]
    """Load a contract record of type ``cls``; None if missing; StateError if malformed."""
    data = read_json(path)
    if data is None:
        return None
    try:
        return cls.from_dict(data)
    except ContractError as err:
        raise StateError(f"{path}: {err}") from err


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
