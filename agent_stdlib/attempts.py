"""Reading and advancing attempt and readiness records (revision +1 per write)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from agent_stdlib import states
from agent_stdlib.contracts import AttemptRecord, ReadinessRecord
from agent_stdlib.statefile import (
    StateError,
    create_many_json,
    load_record,
    write_json_atomic,
    write_many_json,
)


def load_attempt(path: Path) -> Optional[AttemptRecord]:
    """Load an attempt record; None if missing; StateError if malformed."""
    return load_record(path, AttemptRecord)


def created_record(run_id: str, shard: int, attempt: int, now: float,
                   resume_from: Optional[int] = None) -> AttemptRecord:
    """A fresh ``created`` attempt at revision 1: the one shape submit and retry both write."""
    return AttemptRecord(run_id=run_id, shard=shard, attempt=attempt, state=states.CREATED,
                         revision=1, updated_at=now, resume_from=resume_from)


def create_attempt(path: Path, run_id: str, shard: int, attempt: int,
                   resume_from: Optional[int] = None) -> AttemptRecord:
    """Write a fresh ``created`` attempt record at revision 1 (fsynced)."""
    record = created_record(run_id, shard, attempt, time.time(), resume_from)
    write_json_atomic(path, record.to_dict())
    return record


def create_attempts(items: Iterable[Tuple[Union[str, Path], str, int, int, Optional[int]]],
                    in_place: bool = False) -> None:
    """``create_attempt`` for many ``(path, run_id, shard, attempt, resume_from)`` with one
    sync; ``in_place``: new files written where they go (``statefile.create_many_json``:
    the staged attempts of a submit, before ``run.json``), else temp + rename.

    Streams: each record is made, written and dropped (100,000 shards in constant memory).
    """
    now = time.time()
    write = create_many_json if in_place else write_many_json
    write((path, created_record(run_id, shard, attempt, now, resume_from).to_dict())
          for path, run_id, shard, attempt, resume_from in items)


def advance_attempts(items: Sequence[Tuple[Path, Dict[str, Any]]],
                     state: str) -> List[AttemptRecord]:
    """``advance_attempt`` for many ``(path, fields)`` with one sync; all edges checked first."""
    now = time.time()
    updated = []
    for path, fields in items:
        current = load_attempt(path)
        if current is None:
            raise StateError(f"{path}: attempt record is missing")
        states.check_transition(current.state, state)
        updated.append(current.replace(state=state, revision=current.revision + 1,
                                       updated_at=now, **fields))
    write_many_json((item[0], r.to_dict()) for item, r in zip(items, updated))
    return updated


def advance_attempt(path: Path, state: str, **fields: Any) -> AttemptRecord:
    """Move the attempt at ``path`` to ``state`` (a legal edge) at the next revision."""
    current = load_attempt(path)
    if current is None:
        raise StateError(f"{path}: attempt record is missing")
    states.check_transition(current.state, state)
    record = current.replace(
        state=state, revision=current.revision + 1, updated_at=time.time(), **fields
    )
    write_json_atomic(path, record.to_dict())
    return record


def load_readiness(path: Path) -> Optional[ReadinessRecord]:
    """Load a readiness record; None if missing; StateError if malformed."""
    return load_record(path, ReadinessRecord)


def publish_readiness(path: Path, shard: int, attempt: int, execution: int, state: str,
                      **fields: Any) -> ReadinessRecord:
    """Write the next readiness revision for this attempt (a legal edge, revision + 1)."""
    if state not in states.READINESS_STATES:
        raise ValueError(f"unknown readiness state {state!r}")
    current = load_readiness(path)
    states.check_readiness(current.state if current is not None else None, state)
    revision = 1 if current is None else current.revision + 1
    record = ReadinessRecord(
        shard=shard,
        attempt=attempt,
        execution=execution,
        state=state,
        revision=revision,
        updated_at=time.time(),
        **fields,
    )
    write_json_atomic(path, record.to_dict())
    return record
