"""The generator's output: records in index order, written in batches that are fsynced.

One shard writes ``records-<offset>.jsonl`` (every record, in index order) and, when it
drops records (``on_error = "drop"``), ``.dropped-<offset>.jsonl`` (their indices and
why; ``agent_stdlib/candidate.py`` counts them). Lines are buffered and written together
at most every ``BATCH_S`` seconds or ``BATCH_LINES`` lines, records first, then dropped
lines, each followed by an fsync: a kill loses at most the batch in flight, and a torn
last line is cut off on resume.

Resume (a requeued execution of the same attempt) walks both files together from the
shard's first index: the run of indices that are, one after another, either a record or a
dropped line is done; everything after the first gap (a batch whose dropped lines were
not written yet) is cut off and generated again, so no record is lost or duplicated.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterator, List, Optional, Tuple

from ..candidate import dropped_name
from ..resume import KeptRecords, completion_tokens, parse_record

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def record_bytes(record: Dict[str, Any]) -> bytes:
    """One record as its output line: compact JSON, UTF-8, newline-terminated (the one
    encoding of a record line: generated and reused records are byte-identical)."""
    return _encode(record).encode("utf-8") + b"\n"

BATCH_S = 1.0
BATCH_LINES = 512


@dataclass
class Resumed:
    """What an earlier execution of this attempt left: the next index to produce."""

    next_index: int
    records: int = 0
    dropped: int = 0
    tokens: int = 0


def _lines(path: Path) -> Iterator[Tuple[Optional[int], int, int]]:
    """(index or None, end byte offset, completion tokens) of each complete line."""
    if not path.exists():
        return
    position = 0
    with open(path, "rb") as handle:
        for line in handle:
            if not line.endswith(b"\n"):
                return
            position += len(line)
            record = parse_record(line)
            if record is None:
                yield None, position, 0
            else:
                yield record["index"], position, completion_tokens(record)


def _truncate(path: Path, size: int) -> None:
    if path.exists() and path.stat().st_size != size:
        with open(path, "rb+") as handle:
            handle.truncate(size)
            handle.flush()
            os.fsync(handle.fileno())


class Output:
    """The shard's output files (see the module docstring)."""

    def __init__(self, folder: Path, offset: int) -> None:
        stem = f"{offset:012d}"
        self.offset = offset
        self.records_path = folder / f"records-{stem}.jsonl"
        self.dropped_path = folder / dropped_name(stem)
        self._records: Optional[BinaryIO] = None
        self._dropped: Optional[BinaryIO] = None
        self._lines: List[bytes] = []
        self._drops: List[bytes] = []
        self._since = time.monotonic()
        self._handles: Dict[int, BinaryIO] = {}

    def resume(self) -> Resumed:
        """Cut both files back to their common done prefix; what it holds."""
        done = Resumed(self.offset)
        records, drops = _lines(self.records_path), _lines(self.dropped_path)
        rec, drop = next(records, None), next(drops, None)
        kept_records = kept_drops = 0
        while True:
            if rec is not None and rec[0] == done.next_index:
                kept_records, done.records, done.tokens = rec[1], done.records + 1, \
                    done.tokens + rec[2]
                rec = next(records, None)
            elif drop is not None and drop[0] == done.next_index:
                kept_drops, done.dropped = drop[1], done.dropped + 1
                drop = next(drops, None)
            else:
                break
            done.next_index += 1
        for gen in (records, drops):
            gen.close()
        _truncate(self.records_path, kept_records)
        _truncate(self.dropped_path, kept_drops)
        return done

    def record(self, line: bytes) -> None:
        """Add one record line (ends with a newline), the next index in order."""
        self._lines.append(line)

    def drop(self, line: bytes) -> None:
        """Add one dropped-record line, the next index in order."""
        self._drops.append(line)

    def copy_kept(self, kept: KeptRecords, start: int, stop: int) -> int:
        """Copy kept records ``start, start+1, ...`` of an earlier attempt; how many."""
        self._write_lines()
        return kept.copy_run(start, stop, self._file("records"), self._handles)

    def due(self) -> bool:
        """True when the buffered lines should be written now."""
        pending = len(self._lines) + len(self._drops)
        return pending >= BATCH_LINES or bool(pending and
                                              time.monotonic() - self._since >= BATCH_S)

    def flush(self) -> None:
        """Write the buffered lines and fsync both files."""
        self._write_lines()
        for handle in (self._records, self._dropped):
            if handle is not None:
                os.fsync(handle.fileno())
        self._since = time.monotonic()

    def close(self) -> None:
        """Flush and close everything."""
        self.flush()
        for handle in [self._records, self._dropped, *self._handles.values()]:
            if handle is not None:
                handle.close()
        self._records = self._dropped = None
        self._handles.clear()

    def _file(self, which: str) -> BinaryIO:
        if which == "records":
            if self._records is None:
                self._records = open(self.records_path, "ab", buffering=0)
            return self._records
        if self._dropped is None:
            self._dropped = open(self.dropped_path, "ab", buffering=0)
        return self._dropped

    def _write_lines(self) -> None:
        if self._lines:
            _write_all(self._file("records"), b"".join(self._lines))
            self._lines = []
        if self._drops:
            _write_all(self._file("dropped"), b"".join(self._drops))
            self._drops = []


def _write_all(handle: BinaryIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = handle.write(view)
        view = view[written or 0:]
