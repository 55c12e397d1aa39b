"""Result and winner publication, restartable from durable state.

Order inside an allocation: ``result.json`` (immutable) -> cleanup -> attempt
``succeeded`` -> ``winner.json`` (immutable, first writer wins). If the agent dies after
``succeeded``, whoever reads the shard next (``status`` through the control plane, or a
requeued agent) calls :func:`complete_winner`, which rebuilds the same winner from the
attempt's ``result.json`` after re-hashing every file. Two writers can race: ``link``
lets exactly one win and both return the winner on disk.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Union

from . import states
from .attempts import load_attempt
from .candidate import CandidateError, build_manifest, verify_files
from .contracts import ResultManifest, WinnerRecord, sha256_bytes
from .layout import RunLayout
from .statefile import StateError, load_record, publish_immutable, read_bytes


def publish_result(output: Path, result_json: Path, shard: int, attempt: int,
                   expected: int) -> ResultManifest:
    """Validate ``output`` and publish ``result.json`` (an existing one is kept and returned)."""
    manifest = build_manifest(output, shard, attempt, expected)
    if not publish_immutable(result_json, manifest.to_json().encode("utf-8")):
        return load_result(result_json)
    return manifest


def load_result(path: Path) -> ResultManifest:
    """Read a published result manifest; StateError if missing or malformed."""
    manifest = load_record(path, ResultManifest)
    if manifest is None:
        raise StateError(f"{path}: result manifest is missing")
    return manifest


def load_winner(layout: RunLayout, shard: int) -> Optional[WinnerRecord]:
    """The shard's winner, verified the one way every reader verifies it (``verify_winner``)."""
    return verify_winner(layout.winner_json(shard), shard)


def verify_winner(path: Union[str, Path], shard: int) -> Optional[WinnerRecord]:
    """The winner record at ``path`` (the ``winner.json`` of ``shard``), verified.

    It must be a regular file (never followed through a symlink) holding a WinnerRecord
    that names this shard. None when no winner has been published; StateError naming the
    file when one is there but is not such a record (status, runs, retry and merge then
    all treat the shard as damaged, never as succeeded).
    """
    winner = load_record(path, WinnerRecord)
    if winner is not None and winner.shard != shard:
        raise StateError(f"{path}: names shard {winner.shard}, not {shard}")
    return winner


def complete_winner(layout: RunLayout, shard: int, attempt: int,
                    verified: Optional[ResultManifest] = None) -> WinnerRecord:
    """Publish the winner of ``shard`` from the succeeded ``attempt``; return the winner.

    Idempotent: when a winner exists (this attempt's or another's) it is returned as is.
    ``verified`` is the manifest the caller has just built from the same files (the agent
    right after validation), which spares re-hashing them; any other reader re-hashes.
    Raises StateError when the attempt is not ``succeeded`` or its result is unusable.
    """
    existing = load_winner(layout, shard)
    if existing is not None:
        return existing
    paths = layout.attempt(shard, attempt)
    record = load_attempt(paths.attempt_json)
    if record is None or record.state != states.SUCCEEDED:
        state = record.state if record else "missing"
        raise StateError(f"shard {shard} attempt {attempt} is {state}, not succeeded")
    payload = read_bytes(paths.result_json)
    manifest = load_result(paths.result_json)
    if (manifest.shard, manifest.attempt) != (shard, attempt) or payload is None:
        raise StateError(f"{paths.result_json}: names shard {manifest.shard} attempt "
                         f"{manifest.attempt}")
    try:
        if verified is None or verified.files != manifest.files:
            verify_files(paths.output, manifest.files)
    except CandidateError as err:
        raise StateError(f"shard {shard} attempt {attempt}: {err}") from err
    winner = WinnerRecord(shard=shard, attempt=attempt, records=manifest.records,
                          result_sha256=sha256_bytes(payload), files=manifest.files,
                          created_at=time.time(), dropped=manifest.dropped)
    publish_immutable(layout.winner_json(shard), winner.to_json().encode("utf-8"))
    published = load_winner(layout, shard)
    if published is None:  # we or a racing writer just linked it; gone means tampering
        raise StateError(f"{layout.winner_json(shard)}: vanished right after publication")
    return published
