"""Resume across attempts: which records an earlier attempt's kept output already holds.

A retry (attempt N+1) gets the output folder of an earlier attempt as
``SYNTHBATCH_RESUME_DIR``. :func:`scan_kept` reads it (never writes it) and indexes every
*complete* record by its record index: a line that ends with a newline, parses as a JSON
object and carries an integer ``index`` inside the shard's range. A torn last line, a
malformed line, an out-of-range or duplicate index is skipped (the first copy wins).
:class:`KeptRecords` then copies those lines, byte for byte, into the new attempt's output
in index order, so the new attempt's manifest covers the full range while the earlier
attempt's files stay untouched (a hard link would let the new attempt append to them).
Records the earlier attempt dropped (``output/.dropped-*.jsonl``, see
``agent_stdlib/candidate.py``) are done too: their lines are kept in :attr:`KeptRecords.dropped`
and carried over as they are, never requested again.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterable, List, Optional, Tuple

from .candidate import DROPPED

Span = Tuple[int, int, int, int]  # (file number, byte offset, length, completion tokens)
COPY_CHUNK = 1 << 20  # a run of kept lines is copied in pieces of at most this many bytes


@dataclass
class KeptRecords:
    """Complete records of an earlier attempt, by record index (see :func:`scan_kept`)."""

    files: List[Path] = field(default_factory=list)
    spans: Dict[int, Span] = field(default_factory=dict)
    skipped: int = 0  # lines that were not usable records (torn, malformed, out of range)
    dropped: Dict[int, bytes] = field(default_factory=dict)  # index -> its dropped line

    def __len__(self) -> int:
        return len(self.spans) + len(self.dropped)

    def __contains__(self, index: object) -> bool:
        return index in self.spans or index in self.dropped

    def missing(self, indices: Iterable[int]) -> Iterable[int]:
        """The indices of ``indices`` that still have to be generated, in order."""
        return (i for i in indices if i not in self.spans and i not in self.dropped)

    def tokens(self, start: int, stop: int) -> int:
        """The completion tokens of the kept records ``start .. stop-1``."""
        return sum(self.spans[i][3] for i in range(start, stop) if i in self.spans)

    def copy_run(self, start: int, stop: int, out: BinaryIO,
                 handles: Dict[int, BinaryIO]) -> int:
        """Copy kept records ``start, start+1, ...`` (up to ``stop``) until one is missing.

        Adjacent lines of one file are copied as one block (in pieces of ``COPY_CHUNK``).
        Returns how many were copied.
        """
        index = start
        while index < stop and index in self.spans:
            number, offset, length, _ = self.spans[index]
            end = index + 1
            while end < stop and end in self.spans:
                nxt = self.spans[end]
                if nxt[0] != number or nxt[1] != offset + length:
                    break
                length += nxt[2]
                end += 1
            handle = handles.get(number)
            if handle is None:
                handle = handles[number] = open(self.files[number], "rb")
            handle.seek(offset)
            while length:
                block = handle.read(min(length, COPY_CHUNK))
                if not block:
                    raise OSError(f"{self.files[number]}: changed while resuming from it")
                out.write(block)
                length -= len(block)
            index = end
        return index - start


def _count(usage: Any) -> int:
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        return 0
    return tokens


def request_cells(record: Dict[str, Any]) -> List[Dict[str, Any]]:
    """What a record says about its LLM requests, one dict per cell (``usage``,
    ``latency_ms``, ...): each of ``_meta.columns`` (a recipe's LLM columns), or the record
    itself (the prompt template form, whose one request's fields are top-level)."""
    meta = record.get("_meta")
    columns = meta.get("columns") if isinstance(meta, dict) else None
    if isinstance(columns, dict):
        return [c for c in columns.values() if isinstance(c, dict)]
    return [record]


def completion_tokens(record: Dict[str, Any]) -> int:
    """The completion tokens a record reports over its :func:`request_cells`; 0 when
    absent or not a count."""
    return sum(_count(c.get("usage")) for c in request_cells(record))


def parse_record(line: bytes) -> Optional[Dict[str, Any]]:
    """One complete JSONL line as a record with an integer ``index``, or None when it is
    not a usable record."""
    if not line.endswith(b"\n") or not line.strip():
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    index = data.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        return None
    return data


def resume_count(out_file: Path) -> Tuple[int, int]:
    """Complete records already in ``out_file`` and their completion tokens; a torn last
    line is cut off. Reads line by line (the file is not held in memory)."""
    if not out_file.exists():
        return 0, 0
    count = tokens = keep = 0
    with open(out_file, "rb+") as handle:
        for line in handle:
            if not line.endswith(b"\n"):
                break
            record = parse_record(line)
            count, keep = count + 1, keep + len(line)
            tokens += completion_tokens(record) if record is not None else 0
        if keep != os.fstat(handle.fileno()).st_size:
            handle.truncate(keep)
    return count, tokens


def record_index(line: bytes) -> Optional[int]:
    """The ``index`` of one complete JSONL line, or None when it is not a usable record."""
    record = parse_record(line)
    return None if record is None else record["index"]


def _record_files(folder: Path) -> List[Path]:
    """Regular, non-hidden files under ``folder`` in path order; symlinks are ignored."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if not name.startswith(".") and stat.S_ISREG(os.lstat(path).st_mode):
                found.append(path)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def scan_kept(folder: Path, offset: int, count: int) -> KeptRecords:
    """Index the complete records of ``offset .. offset+count-1`` found under ``folder``.

    A missing folder holds nothing. Reads line by line; memory grows with the number of
    kept records (four integers each), not with their size.
    """
    kept = KeptRecords()
    if not folder.is_dir() or folder.is_symlink():
        return kept
    kept.dropped = _dropped_lines(folder, offset, count)
    for path in _record_files(folder):
        number = len(kept.files)
        kept.files.append(path)
        position = 0
        with open(path, "rb") as handle:
            for line in handle:
                record = parse_record(line)
                index = None if record is None else record["index"]
                if index is None or not offset <= index < offset + count \
                        or index in kept.spans or index in kept.dropped:
                    kept.skipped += 1 if line.strip() else 0
                else:
                    kept.spans[index] = (number, position, len(line),
                                         completion_tokens(record))
                position += len(line)
    return kept


def _dropped_lines(folder: Path, offset: int, count: int) -> Dict[int, bytes]:
    """The dropped-record lines of ``folder`` (``.dropped-*.jsonl`` at its top) in range."""
    found: Dict[int, bytes] = {}
    for name in sorted(os.listdir(folder)):
        path = folder / name
        if not DROPPED.fullmatch(name) or not stat.S_ISREG(os.lstat(path).st_mode):
            continue
        with open(path, "rb") as handle:
            for line in handle:
                index = record_index(line)
                if index is not None and offset <= index < offset + count:
                    found.setdefault(index, line)
    return found
