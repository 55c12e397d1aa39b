"""Merge: the winners' files, verified, concatenated in shard order, written atomically."""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from agent_stdlib.candidate import CandidateError, verify_files
from agent_stdlib.contracts import WinnerRecord
from agent_stdlib.layout import RunLayout
from agent_stdlib.statefile import StateError, ensure_dir, write_json_atomic
from control.errors import Conflict
from control.runs.store import load_plan, load_record

CHUNK = 1 << 20


def _winners(layout: RunLayout, count: int) -> tuple[List[WinnerRecord], List[int]]:
    winners, missing = [], []
    for index in range(count):
        try:
            winner = load_record(layout.winner_json(index), WinnerRecord)
        except StateError as err:
            raise Conflict(f"shard {index}: {err}") from err
        if winner is None:
            missing.append(index)
        else:
            winners.append(winner)
    return winners, missing


def _shard_list(indices: List[int], limit: int = 20) -> str:
    shown = ", ".join(str(i) for i in indices[:limit])
    return shown + (f" and {len(indices) - limit} more" if len(indices) > limit else "")


def merge_run(layout: RunLayout, output: Optional[Path], allow_partial: bool) -> Dict[str, Any]:
    """Verify and concatenate every winner; return the merge manifest."""
    plan = load_plan(layout)
    winners, missing = _winners(layout, len(plan.shards))
    if missing and not allow_partial:
        raise Conflict(f"run {plan.run_id}: shards without a winner: {_shard_list(missing)}",
                       hint="wait, retry them, or pass --allow-partial")
    target = output or ensure_dir(layout.merged) / "records.jsonl"
    for winner in winners:
        try:
            verify_files(layout.attempt(winner.shard, winner.attempt).output, winner.files)
        except CandidateError as err:
            raise Conflict(f"shard {winner.shard}: {err}") from err
    digest, size = _concatenate(layout, winners, target)
    manifest = {
        "schema_version": 1,
        "run_id": plan.run_id,
        "output": str(target),
        "sha256": digest,
        "bytes": size,
        "records": sum(w.records for w in winners),
        "complete": not missing,
        "missing_shards": missing,
        "shards": [{"shard": w.shard, "attempt": w.attempt, "records": w.records,
                    "result_sha256": w.result_sha256} for w in winners],
        "merged_at": time.time(),
    }
    write_json_atomic(ensure_dir(layout.merged) / "manifest.json", manifest)
    return manifest


def _concatenate(layout: RunLayout, winners: List[WinnerRecord],
                 target: Path) -> tuple[str, int]:
    temp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    digest, size = hashlib.sha256(), 0
    try:
        with open(temp, "xb") as out:
            for winner in winners:
                base = layout.attempt(winner.shard, winner.attempt).output
                for entry in winner.files:
                    with open(base / entry.path, "rb") as handle:
                        for block in iter(lambda h=handle: h.read(CHUNK), b""):
                            out.write(block)
                            digest.update(block)
                            size += len(block)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return digest.hexdigest(), size
