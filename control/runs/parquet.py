"""Winners' JSONL -> a folder of Parquet files, streamed, with one schema for every shard.

The sources are read in bounded chunks (``CHUNK`` bytes of JSONL, cut at a line end), each
source's bytes hashed as read against its winner's digest. One pass when it can
(:func:`write`): each chunk is parsed once, its types unified with what the plan knows
(``dataschema``) and the chunks before; while that schema does not widen, the chunk is
conformed to it and written. When a later chunk widens it, the two-pass path runs:
:func:`infer` (every chunk's schema unified, a true conflict refused with the shard, record
and field), then :func:`convert` (every chunk parsed with that schema). Row groups hold
about ``CHUNK`` bytes of input (small shard files share one; at most ``ROW_GROUP_ROWS``
rows) in files of about ``FILE_BYTES`` each: ``train-00000-of-00003.parquet``, the names
the Hugging Face Hub and ``datasets`` read as one ``train`` split. Memory holds a row
group's tables and the one being encoded, whatever the number of records.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Tuple

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from synthbatch.control.errors import Conflict
from synthbatch.control.runs.dataschema import SchemaConflict, describe, ordered, unify_schemas

CHUNK = 16 << 20  # bytes of JSONL parsed at once; also about one row group's input
ROW_GROUP_ROWS = 100_000
FILE_BYTES = 256 << 20  # a new file once this many bytes of Parquet are written
READ = pa_json.ReadOptions(block_size=4 << 20)


class Source(Protocol):
    """What the writer needs of one winner file (``merge.Source``)."""

    shard: int
    path: Path
    sha256: str
    size: int


def chunks(path: Path, digest: Optional[Any] = None) -> Iterator[bytes]:
    """The file in pieces of about ``CHUNK`` bytes, each ending at a line end (a last line
    without one gets it); ``digest`` is updated with the file's bytes as read."""
    rest = b""
    with open(path, "rb") as handle:
        while True:
            block = handle.read(CHUNK)
            if digest is not None and block:
                digest.update(block)
            if not block:
                if rest and not rest.isspace():
                    yield rest if rest.endswith(b"\n") else rest + b"\n"
                return
            data = rest + block if rest else block
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            piece = data[:cut]  # the same object when the block ends at a line end
            if piece and not piece.isspace():
                yield piece


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return "a list" if isinstance(value, list) else "an object"


def _at(record: Any, path: str) -> Any:
    for part in path.replace("[]", "").split("."):
        if isinstance(record, list):
            record = next((item for item in record if item is not None), None)
        record = record.get(part) if isinstance(record, dict) else None
    return record


def locate(chunk: bytes, path: str, want: Optional[str]) -> Tuple[Optional[int], str]:
    """The ``index`` of the first record of ``chunk`` whose ``path`` is not of kind
    ``want`` (None: not of the kind the first non-null value had), and that kind."""
    for line in chunk.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        kind = _kind(_at(record, path))
        if kind == "null":
            continue
        if want is None:
            want = kind
        elif kind != want:
            index = record.get("index") if isinstance(record, dict) else None
            return (index if isinstance(index, int) else None), kind
    return None, "?"


def _refuse(source: Source, chunk: bytes, err: Exception) -> Conflict:
    """The one-line refusal of a chunk that cannot be converted, naming shard, record and
    field."""
    if isinstance(err, SchemaConflict):
        want = describe(err.left)
        index, kind = locate(chunk, err.path, want)
        text = f"field {err.path}: {kind if index is not None else describe(err.right)} " \
               f"here, {want} in the shards before"
    else:
        found = re.search(r"Column\(/([^)]*)\)", str(err))
        path = found.group(1).replace("/", ".") if found else ""
        index, _ = locate(chunk, path, None) if path else (None, "")
        text = f"field {path}: {str(err).splitlines()[0]}" if path else \
            str(err).splitlines()[0]
    record = f"record {index}" if index is not None else "a record"
    return Conflict(f"shard {source.shard}: {source.path}: {record}: cannot be converted to "
                    f"parquet: {text}",
                    hint="make the field's type the same in every record, or merge as "
                         "jsonl")


def _read(chunk: bytes, schema: Optional[pa.Schema] = None) -> pa.Table:
    options = pa_json.ParseOptions(explicit_schema=schema,
                                   unexpected_field_behavior="error") \
        if schema is not None else None
    return pa_json.read_json(pa.BufferReader(chunk), read_options=READ,
                             parse_options=options)


def infer(files: List[Source], known: Optional[pa.Schema]) -> pa.Schema:
    """The schema every shard's records fit: the plan's and each chunk's unified
    (Conflict naming shard, record and field when none does)."""
    schema, first = known, None
    for source in files:
        for chunk in chunks(source.path):
            try:
                seen = _read(chunk).schema
                first = first or seen
                schema = unify_schemas(schema, seen)
            except (pa.ArrowInvalid, SchemaConflict) as err:
                raise _refuse(source, chunk, err) from err
    if schema is None:
        return pa.schema([])
    return ordered(schema, first)


Observe = Optional[Callable[[pa.Table], None]]


class _Hashed:
    """A file wrapper hashing and counting what pyarrow writes through it."""

    closed = False

    def __init__(self, handle: Any) -> None:
        self.handle, self.digest, self.size = handle, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        """Hash, count and write ``data``."""
        self.digest.update(data)
        self.size += len(data)
        return self.handle.write(data)

    def tell(self) -> int:
        """Bytes written so far."""
        return self.size

    def flush(self) -> None:
        """Flush the file."""
        self.handle.flush()


class Files:
    """The output folder's Parquet files, opened one after the other; chunks' tables are
    gathered into row groups of about ``CHUNK`` bytes of JSONL (small shard files share
    one), each seen by ``observe`` and written."""

    def __init__(self, folder: Path, schema: pa.Schema, observe: Observe = None) -> None:
        self.folder, self.schema, self.observe = folder, schema, observe
        self.done: List[Dict[str, Any]] = []
        self.writer: Optional[pq.ParquetWriter] = None
        self.out: Optional[_Hashed] = None
        self.handle: Any = None
        self.rows = 0
        self.tables: List[pa.Table] = []
        self.size = 0

    def add(self, table: pa.Table, size: int) -> None:
        """Hold ``table`` (parsed from ``size`` bytes); write once ``CHUNK`` are held."""
        self.tables.append(table)
        self.size += size
        if self.size >= CHUNK:
            self.flush()

    def flush(self) -> None:
        """Write what is held as one row group (or more, past ``ROW_GROUP_ROWS``)."""
        if self.tables:
            table = pa.concat_tables(self.tables) if len(self.tables) > 1 else self.tables[0]
            if self.observe is not None:
                self.observe(table)
            self.write(table)
            self.tables, self.size = [], 0

    def write(self, table: pa.Table) -> None:
        """Append ``table`` as row groups; start a new file past ``FILE_BYTES``."""
        if self.writer is None:
            self.handle = open(self.folder / f"part-{len(self.done):05d}", "xb")
            self.out = _Hashed(self.handle)
            self.writer = pq.ParquetWriter(pa.PythonFile(self.out, mode="w"), self.schema)
        self.writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        self.rows += table.num_rows
        if self.out is not None and self.out.size >= FILE_BYTES:
            self.close()

    def close(self) -> None:
        """Finish the open file (footer, fsync)."""
        if self.writer is None or self.out is None:
            return
        self.writer.close()
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        self.done.append({"sha256": self.out.digest.hexdigest(), "bytes": self.out.size,
                          "records": self.rows})
        self.writer, self.out, self.rows = None, None, 0

    def finish(self) -> List[Dict[str, Any]]:
        """Write what is held, close the last file (an empty run gets one file with no
        rows, so the folder still has the schema) and give every file its final name; the
        file list."""
        self.flush()
        if not self.done and self.writer is None:
            self.write(self.schema.empty_table())
        self.close()
        total = len(self.done)
        for number, entry in enumerate(self.done):
            name = f"train-{number:05d}-of-{total:05d}.parquet"
            os.rename(self.folder / f"part-{number:05d}", self.folder / name)
            entry["path"] = name
        return self.done


Mismatch = Callable[[Source], str]


class _Widened(Exception):
    """A chunk needs a wider schema than the files already written have."""


class _Reparse(Exception):
    """A chunk's inferred column cannot be made the schema's type without the text."""


def conform(array: pa.Array, kind: pa.DataType) -> pa.Array:
    """``array`` (a chunk's inferred column) as ``kind``, a type it unifies into: null
    columns and missing struct fields filled, ints widened; _Reparse where only the JSON
    text can say (a timestamp the reader recognised in text)."""
    if array.type == kind:
        return array
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), kind)
    if pa.types.is_struct(kind) and pa.types.is_struct(array.type):
        have = {array.type.field(i).name: i for i in range(array.type.num_fields)}
        children = [conform(array.field(have[f.name]), f.type) if f.name in have
                    else pa.nulls(len(array), f.type) for f in kind]
        return pa.StructArray.from_arrays(children, fields=list(kind),
                                          mask=array.is_null() if array.null_count else None)
    if pa.types.is_list(kind) and pa.types.is_list(array.type) and array.offset == 0:
        return pa.ListArray.from_arrays(array.offsets, conform(array.values, kind.value_type),
                                        mask=array.is_null() if array.null_count else None)
    if pa.types.is_floating(kind) and pa.types.is_integer(array.type):
        return array.cast(kind)
    raise _Reparse()


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = []
    for field in schema:
        index = table.schema.get_field_index(field.name)
        columns.append(conform(table.column(index).combine_chunks(), field.type)
                       if index >= 0 else pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def write(files: List[Source], folder: Path, known: Optional[pa.Schema],
          stats: Callable[[], Any], mismatch: Mismatch
          ) -> Tuple[List[Dict[str, Any]], Dict[int, str], pa.Schema, Any]:
    """Every source into ``folder`` with one schema: the files written, the shards whose
    bytes failed their digest, the schema, and the statistics object (``stats()`` makes
    one, with ``add``, or None).

    One pass when it can (the module docstring); a chunk that widens the schema (a field
    first seen, an int column that turns float) means the files written so far have the
    wrong schema: they are dropped and the two-pass path runs.
    """
    observer = stats()
    try:
        parts, bad, schema = convert(files, folder, None, getattr(observer, "add", None),
                                     mismatch, known)
        return parts, bad, schema, observer
    except (_Widened, _Reparse):
        for leftover in folder.iterdir():
            leftover.unlink()
    schema = infer(files, known)
    observer = stats()
    parts, bad, _ = convert(files, folder, schema, getattr(observer, "add", None), mismatch)
    return parts, bad, schema, observer


def convert(files: List[Source], folder: Path, schema: Optional[pa.Schema],
            observe: Observe, mismatch: Mismatch, known: Optional[pa.Schema] = None
            ) -> Tuple[List[Dict[str, Any]], Dict[int, str], pa.Schema]:
    """Write every source into ``folder`` with ``schema``; the files written, the shards
    whose bytes did not match their digest (shard -> why; the caller discards the whole
    output) and the schema. ``observe`` sees each row group (the card's statistics).

    ``schema`` None: the one pass of :func:`write`, each chunk's inferred types unified
    with ``known`` and the chunks' before, conformed to that schema; _Widened when a chunk
    widens it (_Reparse: a column only the JSON text can convert).
    """
    fixed = schema is not None
    groups = Files(folder, schema, observe) if fixed else None
    bad: Dict[int, str] = {}
    for source in files:
        digest = hashlib.sha256()
        for chunk in chunks(source.path, digest):
            try:
                table = _read(chunk, schema if fixed else None)
                if not fixed:
                    wider = unify_schemas(schema if schema is not None else known,
                                          table.schema)
            except (pa.ArrowInvalid, SchemaConflict) as err:
                raise _refuse(source, chunk, err) from err
            if not fixed:
                if schema is None:
                    schema = ordered(wider, table.schema)
                    groups = Files(folder, schema, observe)
                elif not wider.equals(schema):
                    raise _Widened()
                table = _conformed(table, schema)
            assert groups is not None
            groups.add(table, len(chunk))
        if digest.hexdigest() != source.sha256 or os.path.getsize(source.path) != source.size:
            bad[source.shard] = mismatch(source)
    if groups is None or schema is None:
        schema = known if known is not None else pa.schema([])
        return Files(folder, schema).finish(), bad, schema
    return groups.finish(), bad, schema


def observe_jsonl(path: Path, observe: Callable[[pa.Table], None]) -> Optional[str]:
    """Feed a merged JSONL file to ``observe`` chunk by chunk (each chunk's own inferred
    types); None, or why the statistics stop short (a chunk pyarrow cannot read)."""
    for chunk in chunks(path):
        try:
            observe(_read(chunk))
        except pa.ArrowInvalid as err:
            return f"column statistics stop short: {str(err).splitlines()[0]}"
    return None
