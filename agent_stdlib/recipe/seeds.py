"""Seed data files: JSONL (one JSON object a line) or CSV (a header line, RFC 4180 quoting).

:func:`scan` reads a file once, line by line, and keeps only the byte offset of every row
(8 bytes a row; the rows themselves stay on disk), so a large seed file is not held in
memory; :func:`read_row` then reads one row by its offset. With ``validate`` every row is
parsed on the way (the login node's plan-time check and preflight); without it only the
row boundaries are found (the generator, which parses the rows it uses). Every problem is
one line naming the file and line: ``topics.jsonl:7: not a JSON object``.

A JSONL row's fields are its keys (values may be any JSON: ``{row.meta.lang}`` works); a
CSV row's fields are the header's names and its values are strings. Blank lines are not
rows.
"""

from __future__ import annotations

import csv
import io
import json
import os
from array import array
from dataclasses import dataclass
from typing import Any, BinaryIO, Dict, List, Sequence, Tuple

from ..errors import AgentError

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
BOM = b"\xef\xbb\xbf"


class SeedError(AgentError, ValueError):
    """A seed file that is missing, empty or malformed; names the file and line."""


@dataclass
class SeedIndex:
    """Where each row of a seed file starts, and the fields of the file."""

    path: str
    format: str
    fields: Tuple[str, ...]  # the CSV header, or the keys of the first JSONL row
    offsets: array  # byte offset of each row ("q")
    end: int  # the file's size when it was scanned

    @property
    def rows(self) -> int:
        """How many rows the file holds."""
        return len(self.offsets)


def format_of(path: str) -> str:
    """``jsonl`` or ``csv`` from the file name's suffix; SeedError for anything else."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise SeedError(f"{path}: unknown seed data format {suffix or '(no suffix)'!r} "
                        f"(have: {', '.join(sorted(FORMATS))})")
    return FORMATS[suffix]


def _open(path: str) -> BinaryIO:
    try:
        handle = open(path, "rb")
    except FileNotFoundError as err:
        raise SeedError(f"{path}: no such file") from err
    except OSError as err:
        raise SeedError(f"{path}: cannot read it ({err.strerror or err})") from err
    if not os.path.isfile(path):
        handle.close()
        raise SeedError(f"{path}: not a regular file")
    return handle


def _text(raw: bytes, path: str, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SeedError(f"{path}:{line}: not UTF-8 text ({err.reason})") from err


def parse_jsonl(raw: bytes, path: str, line: int,
                required: Sequence[str] = ()) -> Dict[str, Any]:
    """One JSONL row as an object; SeedError naming ``path:line``."""
    try:
        value = json.loads(_text(raw, path, line))
    except ValueError as err:
        raise SeedError(f"{path}:{line}: not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise SeedError(f"{path}:{line}: not a JSON object")
    for name in required:
        if name not in value:
            raise SeedError(f"{path}:{line}: no field {name!r}")
    return value


def parse_csv(raw: bytes, path: str, line: int, header: Sequence[str]) -> Dict[str, Any]:
    """One CSV record (possibly several lines) as an object keyed by the header."""
    try:
        values = next(csv.reader(io.StringIO(_text(raw, path, line), newline=""),
                                 strict=True))
    except (csv.Error, StopIteration) as err:
        raise SeedError(f"{path}:{line}: not a CSV record ({err})") from err
    if len(values) != len(header):
        raise SeedError(f"{path}:{line}: {len(values)} fields, the header has "
                        f"{len(header)}")
    return dict(zip(header, values))


def _header(raw: bytes, path: str, line: int) -> Tuple[str, ...]:
    try:
        fields = tuple(next(csv.reader(io.StringIO(_text(raw, path, line), newline=""),
                                       strict=True)))
    except (csv.Error, StopIteration) as err:
        raise SeedError(f"{path}:{line}: not a CSV header ({err})") from err
    if not fields or any(not name.strip() for name in fields):
        raise SeedError(f"{path}:{line}: the header has an empty field name")
    dupes = sorted({n for n in fields if fields.count(n) > 1})
    if dupes:
        raise SeedError(f"{path}:{line}: the header names {dupes[0]!r} twice")
    return fields


def _records(handle: BinaryIO, csv_quotes: bool):
    """(byte offset, first line number, raw bytes) of every non-blank record."""
    position, number = 0, 0
    pending: List[bytes] = []
    start = start_line = 0
    quotes = 0
    for line in handle:
        number += 1
        if number == 1 and line.startswith(BOM):
            line, position = line[len(BOM):], len(BOM)
        if not pending:
            start, start_line = position, number
            if not line.strip():
                position += len(line)
                continue
        pending.append(line)
        position += len(line)
        if csv_quotes:
            quotes += line.count(b'"')
            if quotes % 2:
                continue  # a quoted field goes on on the next line
        yield start, start_line, b"".join(pending)
        pending, quotes = [], 0
    if pending:
        yield start, start_line, b"".join(pending)


def scan(path: str, validate: bool = True, required: Sequence[str] = ()) -> SeedIndex:
    """Index the rows of ``path`` (see the module docstring); SeedError if unusable.

    ``required`` names fields every row must have (checked when ``validate``; for CSV
    against the header always).
    """
    kind = format_of(path)
    offsets = array("q")
    fields: Tuple[str, ...] = ()
    with _open(path) as handle:
        for start, line, raw in _records(handle, kind == "csv"):
            if kind == "csv" and not fields:
                fields = _header(raw, path, line)
                missing = [n for n in required if n not in fields]
                if missing:
                    raise SeedError(f"{path}:{line}: the header has no field {missing[0]!r}")
                continue
            if validate or not offsets:
                row = parse_csv(raw, path, line, fields) if kind == "csv" else \
                    parse_jsonl(raw, path, line, required)
                if not offsets and kind == "jsonl":
                    fields = tuple(row)
            offsets.append(start)
        end = handle.tell()
    if not offsets:
        raise SeedError(f"{path}: empty (no rows)")
    return SeedIndex(path, kind, fields, offsets, end)


def peek_fields(path: str) -> Tuple[str, ...]:
    """The fields of a seed file from its first row (the CSV header), reading no further."""
    kind = format_of(path)
    with _open(path) as handle:
        for _, line, raw in _records(handle, kind == "csv"):
            return _header(raw, path, line) if kind == "csv" else \
                tuple(parse_jsonl(raw, path, line))
    raise SeedError(f"{path}: empty (no rows)")


def line_of(index: SeedIndex, row: int) -> int:
    """The line number row ``row`` starts on (counted again: only for messages)."""
    with _open(index.path) as handle:
        head = handle.read(index.offsets[row])
    return head.count(b"\n") + 1


def read_row(handle: BinaryIO, index: SeedIndex, row: int,
             required: Sequence[str] = ()) -> Dict[str, Any]:
    """Row number ``row`` of an indexed file (``handle`` is the file, opened ``rb``)."""
    start = index.offsets[row]
    stop = index.offsets[row + 1] if row + 1 < index.rows else index.end
    handle.seek(start)
    raw = handle.read(stop - start).rstrip(b"\r\n")
    try:
        if index.format == "csv":
            return parse_csv(raw, index.path, 0, index.fields)
        return parse_jsonl(raw, index.path, 0, required)
    except SeedError as err:
        line = line_of(index, row)
        raise SeedError(str(err).replace(f"{index.path}:0:", f"{index.path}:{line}:")) \
            from err


def open_rows(path: str) -> BinaryIO:
    """The seed file opened for :func:`read_row`; SeedError if it cannot be opened."""
    return _open(path)
