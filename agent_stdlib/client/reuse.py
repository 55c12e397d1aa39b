"""Cells an earlier run already generated (issue 31): the generator's lookup.

:class:`Cells` reads the records of reused runs once, for the new shard's index range
only, and keeps per record index and column the cell's request digest, value and
``_meta``. A new cell whose request digest (``recipe.reuse.request_digest``) equals a
kept one takes that value instead of asking a model; its ``_meta`` says
``reused_from``. Records match by index, so the shard layouts need not agree; a reused
cell that was itself reused (a chain) carries its digest along. Damaged lines are
skipped and counted per file, and a file that cannot be read is named and skipped (its
cells are then generated): never fatal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

Cell = Tuple[str, Any, Dict[str, Any]]  # request digest, value, meta


class Cells:
    """Reusable cells by (index, column), first reused run first."""

    def __init__(self) -> None:
        self.cells: Dict[Tuple[int, str], Cell] = {}
        self.damaged = 0  # lines that were no record
        self.problems: List[str] = []  # one line per damaged or unreadable file
        self.reused = 0  # cells handed out

    def add_run(self, run_id: str, files: Iterable[Path], first: int, count: int) -> None:
        """Keep the cells of records ``first .. first+count-1`` of ``files`` (a run)."""
        for path in files:
            damaged = 0
            try:
                with open(path, "rb") as handle:
                    for line in handle:
                        damaged += not self._add_line(run_id, line, first, first + count)
            except OSError as err:
                self.problems.append(f"{run_id}: {path}: unreadable ({err.strerror}): "
                                     "skipped, its cells are generated")
            if damaged:
                self.damaged += damaged
                self.problems.append(f"{run_id}: {path}: {damaged} damaged line(s) "
                                     "skipped, their cells are generated")

    def _add_line(self, run_id: str, line: bytes, low: int, high: int) -> bool:
        """Keep one line's cells; False when it is no record."""
        try:
            record = json.loads(line)
            index = record["index"]
            columns = record["_meta"]["columns"]
        except (ValueError, KeyError, TypeError):
            return False
        if not isinstance(index, int) or not low <= index < high or not isinstance(
                columns, dict) or record.get("_error") is not None:
            return True
        for name, meta in columns.items():
            digest = meta.get("request_digest") if isinstance(meta, dict) else None
            if isinstance(digest, str) and name in record:
                kept = dict(meta)
                kept.setdefault("reused_from", run_id)
                self.cells.setdefault((index, name), (digest, record[name], kept))
        return True

    def take(self, index: int, column: str, digest: str) -> Optional[Tuple[Any, Dict[str, Any]]]:
        """(value, meta) of a kept cell whose request is ``digest``; None: generate it."""
        cell = self.cells.get((index, column))
        if cell is None or cell[0] != digest:
            return None
        self.reused += 1
        return cell[1], dict(cell[2])


def run_files(run_dir: Path) -> List[Path]:
    """The record files of a reused run, one attempt per shard: the winner's when the
    shard has one, else its latest attempt's (a partially finished run gives what it
    has). A damaged winner record falls back to the latest attempt."""
    files: List[Path] = []
    for shard in sorted((run_dir / "shards").glob("shard-*")):
        attempts = sorted((shard / "attempts").glob("attempt-*"))
        chosen = attempts[-1] if attempts else None
        try:
            won = json.loads((shard / "winner.json").read_text())["attempt"]
            chosen = shard / "attempts" / f"attempt-{int(won):04d}"
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if chosen is not None:
            files += sorted((chosen / "output").glob("records-*.jsonl"))
    return files
