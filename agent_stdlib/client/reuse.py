"""Cells an earlier run already generated (issue 31): the generator's lookup.

:class:`Cells` reads the records of reused runs once, for the new shard's index range
only, and keeps per record index and column the cell's request digest, value and
``_meta``. A new cell whose request digest (``recipe.reuse.request_digest``) equals a
kept one takes that value instead of asking a model; its ``_meta`` says
``reused_from``. Records match by index, so the shard layouts need not agree; a reused
cell that was itself reused (a chain) carries its digest along. Damaged lines are
skipped and counted per file, and a file that cannot be read is named and skipped (its
cells are then generated): never fatal.

Records that may be taken whole (``wholereuse``: the caller proved the run's recipe the
same, ``whole=True``) are kept as they were read too, with their file's seed tag, for
:meth:`Cells.whole`: the first reused run that gives any cell of an index is the only one
whose record of that index may be.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..layout import ATTEMPTS, WINNER_JSON, RunLayout, attempt_number, attempt_path, shard_name
from ..statefile import StateError, read_json, read_json_or_none
from .wholereuse import inputs_path, read_tag, record_line

Cell = Tuple[str, Any, Dict[str, Any]]  # request digest, value, meta


class Cells:
    """Reusable cells by (index, column), first reused run first."""

    def __init__(self) -> None:
        self.cells: Dict[Tuple[int, str], Cell] = {}
        self.damaged = 0  # lines that were no record
        self.problems: List[str] = []  # one line per damaged or unreadable file
        self.reused = 0  # cells handed out
        self.copied = 0  # records taken whole
        self.records: Dict[int, Tuple[str, Dict[str, Any], str]] = {}  # run, record, tag
        self._seen: Set[int] = set()  # indexes some run gave a cell of
        self._tag: Optional[str] = None  # the seed tag of the file being read (whole)

    def add_run(self, run_id: str, files: Iterable[Path], first: int, count: int,
                whole: bool = False) -> None:
        """Keep the cells of records ``first .. first+count-1`` of ``files`` (a run);
        ``whole``: its records too (its recipe is proven the same, ``wholereuse``)."""
        for path in files:
            damaged = 0
            self._tag = read_tag(inputs_path(path)) if whole else None
            try:
                with open(path, "rb") as handle:
                    handle.seek(start_of(handle, first))
                    for line in handle:
                        index = self._add_line(run_id, line, first, first + count)
                        if index is None:
                            damaged += 1
                        elif index >= first + count:
                            break  # a shard's records are in index order: no more here
            except OSError as err:
                self.problems.append(f"{run_id}: {path}: unreadable ({err.strerror}): "
                                     "skipped, its cells are generated")
            if damaged:
                self.damaged += damaged
                self.problems.append(f"{run_id}: {path}: {damaged} damaged line(s) "
                                     "skipped, their cells are generated")

    def _add_line(self, run_id: str, line: bytes, low: int, high: int) -> Optional[int]:
        """Keep one line's cells; the record's index (-1: none), None when it is no
        record."""
        try:
            record = _decode(line.decode("utf-8"))
            index = record["index"]
            columns = record["_meta"]["columns"]
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(index, int) or isinstance(index, bool):
            return -1
        if not low <= index < high or not isinstance(columns, dict) or \
                record.get("_error") is not None:
            return index
        if self._tag is not None and index not in self._seen:
            self._seen.add(index)  # the first run of this index: its cells only if needed
            self.records[index] = (run_id, record, self._tag)
        else:
            self._keep(run_id, index, record, columns, False)
        return index

    def _keep(self, run_id: str, index: int, record: Dict[str, Any],
              columns: Dict[str, Any], first: bool) -> None:
        """Keep the cells of one record (``first``: before any other run's)."""
        for name, meta in columns.items():
            digest = meta.get("request_digest") if isinstance(meta, dict) else None
            if isinstance(digest, str) and name in record:
                kept = dict(meta)
                kept.setdefault("reused_from", run_id)
                if first:
                    self.cells[(index, name)] = (digest, record[name], kept)
                else:
                    self.cells.setdefault((index, name), (digest, record[name], kept))
                self._seen.add(index)

    def _cells_of(self, index: int) -> None:
        """The cells of record ``index`` kept whole, for the per-cell path."""
        kept = self.records.pop(index, None)
        if kept is not None:
            self._keep(kept[0], index, kept[1], kept[1]["_meta"]["columns"], True)

    def whole(self, index: int, tag: str, llm: Sequence[str],
              tail: List[str]) -> Optional[bytes]:
        """Record ``index`` taken whole (``wholereuse.record_line``) when its file's seed
        tag is ``tag``; None: the per-cell path (then its cells are kept)."""
        kept = self.records.get(index)
        line = record_line(kept[1], index, kept[0], llm, tail) \
            if kept is not None and kept[2] == tag else None
        if line is None:
            self._cells_of(index)
            return None
        del self.records[index]
        self.reused += len(llm)
        self.copied += 1
        return line

    def take(self, index: int, column: str, digest: str) -> Optional[Tuple[Any, Dict[str, Any]]]:
        """(value, meta) of a kept cell whose request is ``digest``; None: generate it."""
        if index in self.records:
            self._cells_of(index)
        cell = self.cells.get((index, column))
        if cell is None or cell[0] != digest:
            return None
        self.reused += 1
        return cell[1], dict(cell[2])


_decode = json.JSONDecoder().decode  # json.loads of a UTF-8 line, without its detection
SCAN_BYTES = 1 << 16  # the bisection stops at this much of a file; the rest is read


def _index(line: bytes) -> Optional[int]:
    try:
        index = json.loads(line)["index"]
    except (ValueError, KeyError, TypeError):
        return None
    return index if isinstance(index, int) and not isinstance(index, bool) else None


def start_of(handle: BinaryIO, low: int) -> int:
    """A byte offset of ``handle`` (a shard's records, one a line in index order) from
    which every record of index ``low`` on follows: a bisection over byte offsets, each
    probe one line, stopped within ``SCAN_BYTES``, so a new shard whose range starts in
    the middle of an earlier shard's file reads little of what comes before it. A probe
    that finds no record gives up (0 or what was already sure): damage costs reading,
    never records."""
    lo, hi = 0, handle.seek(0, 2)
    while hi - lo > SCAN_BYTES:
        mid = (lo + hi) // 2
        handle.seek(mid)
        handle.readline()  # the rest of the line the probe landed in
        at = handle.tell()
        line = handle.readline()
        if not line:
            hi = mid
            continue
        index = _index(line)
        if index is None:
            break
        if index < low:
            lo = at  # this line and every one before it come before ``low``
        else:
            hi = mid
    return lo


def _overlapping(run_dir: Path, first: int, count: int) -> Optional[Set[str]]:
    """The folder names of the reused run's shards that hold records ``first ..
    first+count-1`` (from its ``plan.json``); None when the plan cannot say (every shard
    is read then)."""
    try:
        shards = (read_json_or_none(RunLayout(run_dir).plan_json) or {})["shards"]
        return {shard_name(s["index"]) for s in shards
                if s["record_offset"] < first + count
                and first < s["record_offset"] + s["num_records"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_files(run_dir: Path, first: int = 0, count: Optional[int] = None) -> List[Path]:
    """The record files of a reused run, one attempt per shard: the winner's when the
    shard has one, else its latest attempt's (a partially finished run gives what it
    has). A damaged winner record falls back to the latest attempt. With ``count``,
    only the shards that hold records ``first .. first+count-1``: a shard of the new
    run reads the records of its own range, not the whole earlier run."""
    wanted = _overlapping(run_dir, first, count) if count is not None else None
    files: List[Path] = []
    for shard in sorted(RunLayout(run_dir).shards.glob("shard-*")):
        if wanted is not None and shard.name not in wanted:
            continue
        chosen = _winner(shard)
        if chosen is None:
            numbers = sorted(n for n in map(attempt_number, _names(shard / ATTEMPTS))
                             if n is not None)
            chosen = numbers[-1] if numbers else None
        if chosen is not None:
            folder = Path(attempt_path(str(shard), chosen))
            files += sorted((folder / "output").glob("records-*.jsonl"))
    return files


def _winner(shard: Path) -> Optional[int]:
    """The winning attempt of a reused shard (the one tolerant reader: no symlink, this
    user's file); None if there is none or its record is damaged."""
    try:
        won = read_json(shard / WINNER_JSON)
    except StateError:
        return None
    attempt = won.get("attempt") if won is not None else None
    return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None


def _names(folder: Path) -> List[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []
