"""Reading and advancing attempt and readiness records (revision +1 per write).

A submit's first attempts have no ``attempt.json`` (nor folder) until something writes
their second revision: their first is *implied* by the submission record that carries
them (``implied_attempt``: ``submitted`` with its task's job id once the record holds the
array's job id, ``created`` before). Submit so writes nothing per shard; the agent that
starts the attempt, or the ``cancel``/``status`` that ends it, makes the folder and
publishes the record (``advance_attempt(..., first=...)``: linked, never over a record
another writer published first).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable, List, Optional, Tuple, Union

from . import states
from .contracts import AttemptRecord, ReadinessRecord
from .statefile import (
    StateError,
    ensure_dir,
    load_record,
    publish_json_immutable,
    write_json_atomic,
    write_many_json,
)


def load_attempt(path: Union[str, Path]) -> Optional[AttemptRecord]:
    """Load an attempt record; None if missing; StateError if malformed."""
    return load_record(path, AttemptRecord)


def created_record(run_id: str, shard: int, attempt: int, now: float,
                   resume_from: Optional[int] = None) -> AttemptRecord:
    """A fresh ``created`` attempt at revision 1: the one shape submit and retry both write."""
    return AttemptRecord(run_id=run_id, shard=shard, attempt=attempt, state=states.CREATED,
                         revision=1, updated_at=now, resume_from=resume_from)


def implied_attempt(run_id: str, shard: int, attempt: int, job_id: Optional[str],
                    submission: Optional[int], submitted_at: float) -> AttemptRecord:
    """The first revision of an attempt that has no record, as its submission implies it.

    ``job_id`` is its task's job id (``arrays.task_job_id`` of the submission record's job
    id), None until sbatch answered: ``submitted`` with it, dated by the submission, or
    ``created`` while there is none. The one shape the agent, cancel and status start from.
    """
    state = states.CREATED if job_id is None else states.SUBMITTED
    return AttemptRecord(run_id=run_id, shard=shard, attempt=attempt, state=state,
                         revision=1, updated_at=submitted_at, submission=submission,
                         job_id=job_id)


def create_attempts(items: Iterable[Tuple[Union[str, Path], str, int, int, Optional[int]]]
                    ) -> None:
    """Write a fresh ``created`` attempt record at revision 1 for each ``(path, run_id,
    shard, attempt, resume_from)``, with one sync (each atomically: temp + rename).

    Streams: each record is made, written and dropped (100,000 shards in constant memory).
    """
    now = time.time()
    write_many_json((path, created_record(run_id, shard, attempt, now, resume_from).to_dict())
                    for path, run_id, shard, attempt, resume_from in items)


Submitted = Tuple[Union[str, Path], str, int, int, str, int]


def submit_attempts(items: Iterable[Submitted], only_created: bool = False) -> int:
    """Record many ``created`` attempts ``submitted`` with one sync; return how many.

    ``items`` are ``(path, run_id, shard, attempt, job_id, submission)``: a retry's
    attempts (a submit's first attempts have no record to advance: their submission
    record implies them). Each moves on to the next revision. A missing record raises
    StateError and any other state TransitionError before anything is written, or with
    ``only_created`` (recovery: a cancel or the agent got there first) is left as it is.
    """
    now = time.time()
    updated: List[Tuple[Union[str, Path], AttemptRecord]] = []
    for path, _run_id, shard, attempt, job_id, submission in items:
        current = load_attempt(path)
        if current is None:
            if only_created:
                continue
            raise StateError(f"{path}: attempt record is missing")
        if current.state != states.CREATED:
            if only_created:
                continue
            states.check_transition(current.state, states.SUBMITTED)
        updated.append((path, current.replace(
            state=states.SUBMITTED, updated_at=now, revision=current.revision + 1,
            shard=shard, attempt=attempt, job_id=job_id, submission=submission)))
    write_many_json((path, record.to_dict()) for path, record in updated)
    return len(updated)



def advance_attempt(path: Path, state: str, first: Optional[AttemptRecord] = None,
                    **fields: Any) -> AttemptRecord:
    """Move the attempt at ``path`` to ``state`` (a legal edge) at the next revision.

    ``first``: the attempt's implied first revision (``implied_attempt``), used when it has
    no record yet: its folder is made and the next revision published only if no other
    writer published one first (a link: then that record is advanced instead).
    """
    current = load_attempt(path)
    if current is None and first is not None:
        states.check_transition(first.state, state)
        record = first.replace(state=state, revision=first.revision + 1,
                               updated_at=time.time(), **fields)
        ensure_dir(path.parent)
        if publish_json_immutable(path, record.to_dict()):
            return record
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
